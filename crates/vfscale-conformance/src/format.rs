//! What the scenario formats share: reading JSON Lines one step per line, errors that
//! name the line and the field, and the errors of a replay.
//!
//! ```
//! use vfscale_conformance::format::{field, parse_lines};
//! let text = "# a comment\n{\"op\":\"close\",\"fd\":\"d1\"}\n{\"op\":\"close\"}\n";
//! let err = parse_lines(text, |o, line| field::str(o, line, "fd").map(str::to_string)).unwrap_err();
//! assert_eq!(err.to_string(), "line 3: missing field `fd`");
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

/// One step's JSON object.
pub type Object = Map<String, Value>;

/// A scenario that cannot be parsed or replayed, with the line it happened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioError {
    /// 1-based line number, 0 when the error is not about one line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl ScenarioError {
    /// An error about `line`.
    pub fn at(line: usize, message: impl Into<String>) -> Self {
        ScenarioError {
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Why a kernel replay failed.
#[derive(Debug)]
pub enum ReplayError {
    /// The scenario is malformed or breaks a rule of the format.
    Scenario(ScenarioError),
    /// The kernel target failed: a system call of the runner itself failed, a process
    /// died or did not answer, or the system did not settle in time. The message names
    /// the step and its line.
    Kernel(String),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Scenario(e) => write!(f, "{e}"),
            ReplayError::Kernel(m) => write!(f, "kernel replay: {m}"),
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Scenario(e) => Some(e),
            ReplayError::Kernel(_) => None,
        }
    }
}

impl From<ScenarioError> for ReplayError {
    fn from(e: ScenarioError) -> Self {
        ReplayError::Scenario(e)
    }
}

/// Reads JSON Lines text: each line that is not blank and does not start with `#` or
/// `//` must be a JSON object, which `step` turns into a step. Returns the steps with
/// their 1-based line numbers.
pub fn parse_lines<T>(
    text: &str,
    mut step: impl FnMut(&Object, usize) -> Result<T, ScenarioError>,
) -> Result<Vec<(usize, T)>, ScenarioError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with("//") {
            continue;
        }
        let v: Value =
            serde_json::from_str(t).map_err(|e| ScenarioError::at(line, format!("not valid JSON: {e}")))?;
        let Value::Object(o) = v else {
            return Err(ScenarioError::at(line, "a step must be a JSON object"));
        };
        out.push((line, step(&o, line)?));
    }
    Ok(out)
}

/// Typed reads of a step's fields; every error names the line and the field.
pub mod field {
    use super::{Object, ScenarioError};
    use serde_json::Value;

    fn missing(line: usize, k: &str) -> ScenarioError {
        ScenarioError::at(line, format!("missing field `{k}`"))
    }

    /// A required, non-empty string.
    pub fn str<'a>(o: &'a Object, line: usize, k: &str) -> Result<&'a str, ScenarioError> {
        match o.get(k) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s),
            Some(Value::String(_)) => Err(ScenarioError::at(line, format!("field `{k}` is empty"))),
            Some(_) => Err(ScenarioError::at(line, format!("field `{k}` must be a string"))),
            None => Err(missing(line, k)),
        }
    }

    /// A required integer that fits `T`; `what` describes `T` in the message.
    pub fn int<T: TryFrom<i64> + TryFrom<u64>>(
        o: &Object,
        line: usize,
        k: &str,
        what: &str,
    ) -> Result<T, ScenarioError> {
        let bad = |v: &Value| ScenarioError::at(line, format!("field `{k}` must be {what}, not {v}"));
        match o.get(k) {
            Some(v) => {
                if let Some(i) = v.as_i64() {
                    T::try_from(i).map_err(|_| bad(v))
                } else if let Some(u) = v.as_u64() {
                    T::try_from(u).map_err(|_| bad(v))
                } else {
                    Err(bad(v))
                }
            }
            None => Err(missing(line, k)),
        }
    }

    /// A required string naming a value, which `lookup` finds; `what` says what the
    /// field names, for the message when it finds none.
    pub fn named<T>(
        o: &Object,
        line: usize,
        k: &str,
        what: &str,
        lookup: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, ScenarioError> {
        let v = str(o, line, k)?;
        lookup(v).ok_or_else(|| ScenarioError::at(line, format!("field `{k}`: unknown {what} {v:?}")))
    }

    /// An optional boolean, `false` when absent.
    pub fn bool(o: &Object, line: usize, k: &str) -> Result<bool, ScenarioError> {
        match o.get(k) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ScenarioError::at(
                line,
                format!("field `{k}` must be true or false, not {v}"),
            )),
        }
    }

    /// A required boolean.
    pub fn bool_required(o: &Object, line: usize, k: &str) -> Result<bool, ScenarioError> {
        if !o.contains_key(k) {
            return Err(missing(line, k));
        }
        bool(o, line, k)
    }

    /// The error for an `op` the format does not know; every format words it alike.
    pub fn unknown_op(line: usize, op: &str) -> ScenarioError {
        ScenarioError::at(line, format!("field `op`: unknown op {op:?}"))
    }

    /// Rejects any field but `op` and those in `allowed`.
    pub fn only(o: &Object, line: usize, op: &str, allowed: &[&str]) -> Result<(), ScenarioError> {
        match o.keys().find(|k| *k != "op" && !allowed.contains(&k.as_str())) {
            Some(k) => Err(ScenarioError::at(
                line,
                format!("unknown field `{k}` for op `{op}`"),
            )),
            None => Ok(()),
        }
    }
}

/// An operation of a scenario format: read from one line's object, written back as one.
pub trait StepOp: Sized {
    /// Parses one step's object (the errors name `line` and the field).
    fn parse(o: &Object, line: usize) -> Result<Self, ScenarioError>;
    /// The step as a JSON object, the inverse of [`StepOp::parse`].
    fn to_json(&self) -> Value;
}

/// One step: the operation and the line of the file it came from (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step<Op> {
    /// 1-based line number in the source file.
    pub line: usize,
    /// The operation.
    pub op: Op,
}

/// A parsed scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario<Op> {
    /// The steps, in order; step `i` is `steps[i]`.
    pub steps: Vec<Step<Op>>,
}

impl<Op> Default for Scenario<Op> {
    fn default() -> Self {
        Scenario { steps: Vec::new() }
    }
}

impl<Op: StepOp> Scenario<Op> {
    /// Parses JSON Lines text (see [`parse_lines`]).
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let steps = parse_lines(text, Op::parse)?;
        Ok(Scenario {
            steps: steps.into_iter().map(|(line, op)| Step { line, op }).collect(),
        })
    }

    /// The scenario as JSON Lines text.
    pub fn to_jsonl(&self) -> String {
        let mut s = String::new();
        for st in &self.steps {
            s.push_str(&st.op.to_json().to_string());
            s.push('\n');
        }
        s
    }
}

/// Where in a scenario a runner is, for the messages of kernel failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    /// Step number, from 0.
    pub step: usize,
    /// 1-based line number.
    pub line: usize,
}

impl At {
    /// A kernel failure at this step, naming it and its line.
    pub fn kernel(self, msg: impl fmt::Display) -> ReplayError {
        ReplayError::Kernel(format!("step {} (line {}): {msg}", self.step, self.line))
    }
}

/// The result of one step of a scenario format, as the `result` value of its line.
pub trait StepOutcome {
    /// The `result` value as the format's spec renders it.
    fn to_json(&self) -> Value;
}

/// The result line of one step.
///
/// ```
/// use serde_json::{json, Value};
/// use vfscale_conformance::format::{render_results, StepOutcome, StepResult};
/// struct Done;
/// impl StepOutcome for Done {
///     fn to_json(&self) -> Value {
///         json!("ok")
///     }
/// }
/// let mut r = StepResult::new(4, Done);
/// assert_eq!(r.to_json_line(), r#"{"step":4,"result":"ok"}"#);
/// r.completed.push((1, Done));
/// assert_eq!(
///     render_results(&[r]),
///     "{\"step\":4,\"result\":\"ok\",\"completed\":[{\"step\":1,\"result\":\"ok\"}]}\n"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StepResult<O> {
    /// Step number, from 0.
    pub step: usize,
    /// Its result.
    pub result: O,
    /// Earlier blocked calls that finished because of this step, sorted by step (always
    /// empty in the formats without blocking calls).
    pub completed: Vec<(usize, O)>,
}

impl<O> StepResult<O> {
    /// The result of step `step`, with no completions.
    pub fn new(step: usize, result: O) -> Self {
        StepResult {
            step,
            result,
            completed: Vec::new(),
        }
    }

    /// The result of step `step` once the woken waiters are settled: `result` is what its
    /// call returned, `completed` the blocked calls that finished meanwhile, by step. A
    /// call that blocked and finished within its own step reports how it finished.
    pub fn settled(
        step: usize,
        result: O,
        mut completed: BTreeMap<usize, O>,
        is_blocked: impl FnOnce(&O) -> bool,
    ) -> Self {
        let result = match completed.remove(&step) {
            Some(done) if is_blocked(&result) => done,
            _ => result,
        };
        StepResult {
            step,
            result,
            completed: completed.into_iter().collect(),
        }
    }
}

impl<O> StepResult<O> {
    /// The result of a library runner's step, numbered from `next` (which moves on even
    /// when the step fails); a failure names the step's `line`.
    pub fn numbered(result: Result<O, String>, line: usize, next: &mut usize) -> Result<Self, ScenarioError> {
        let step = *next;
        *next += 1;
        result
            .map(|r| StepResult::new(step, r))
            .map_err(|m| ScenarioError::at(line, m))
    }
}

/// Scenario names (of processes, handles, ...) in sorted order, as runners list them.
pub fn sorted_names<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut v: Vec<String> = names.into_iter().cloned().collect();
    v.sort();
    v
}

impl<O: StepOutcome> StepResult<O> {
    /// The result as one JSON line (without the newline): `{"step":4,"result":R}`, with a
    /// `completed` array of `{"step":S,"result":R}` objects only when it is not empty.
    pub fn to_json_line(&self) -> String {
        let mut o = Object::new();
        o.insert("step".into(), Value::from(self.step));
        o.insert("result".into(), self.result.to_json());
        if !self.completed.is_empty() {
            let c: Vec<Value> = self
                .completed
                .iter()
                .map(|(s, r)| {
                    let mut e = Object::new();
                    e.insert("step".into(), Value::from(*s));
                    e.insert("result".into(), r.to_json());
                    Value::Object(e)
                })
                .collect();
            o.insert("completed".into(), Value::Array(c));
        }
        Value::Object(o).to_string()
    }
}

/// Renders results as JSON Lines, one line per step.
pub fn render_results<O: StepOutcome>(results: &[StepResult<O>]) -> String {
    let mut s = String::new();
    for r in results {
        s.push_str(&r.to_json_line());
        s.push('\n');
    }
    s
}

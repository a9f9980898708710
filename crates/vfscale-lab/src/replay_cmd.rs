//! `vfscale locks replay|check` and `vfscale fd replay|check`: scenarios replayed against
//! the library, the kernel, or both.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vfscale_locks::{Settings, WakeMode};

use crate::cli::{Against, CheckArgs, FdCheckArgs, FdReplayArgs, ReplayArgs, Wake};

/// A scenario format with its two runners; each returns the rendered result lines.
trait Subsystem {
    /// Why the kernel runner cannot run here, if it cannot.
    fn kernel_available(&self) -> Result<(), String>;
    /// Parses `text` and replays it against the library.
    fn library(&self, text: &str) -> Result<String, String>;
    /// Parses `text` and replays it against the kernel.
    fn kernel(&self, text: &str) -> Result<String, String>;
}

struct Locks(Settings);

impl Subsystem for Locks {
    fn kernel_available(&self) -> Result<(), String> {
        vfscale_conformance::locks::kernel::available()
    }
    fn library(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::locks::{library, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        library::replay_with(&scn, self.0)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
    fn kernel(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::locks::{kernel, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        kernel::replay(&scn)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
}

struct Fds {
    child: PathBuf,
}

impl Subsystem for Fds {
    fn kernel_available(&self) -> Result<(), String> {
        if !self.child.exists() {
            return Err(format!(
                "the helper program {} is missing: build it with `cargo build --release -p vfscale-fdtable` \
                 (it lands next to vfscale), or name it with --child",
                self.child.display()
            ));
        }
        vfscale_conformance::fd::kernel::available(&self.child)
    }
    fn library(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::fd::{library, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        library::replay(&scn)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
    fn kernel(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::fd::{kernel, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        kernel::replay(&scn, &self.child)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
}

fn lock_settings(w: Wake) -> Settings {
    Settings {
        wake: match w {
            Wake::Tree => WakeMode::Tree,
            Wake::All => WakeMode::All,
        },
        ..Settings::default()
    }
}

/// `vfscale-fd-child` next to this executable, unless named.
fn fd_child(named: &Option<PathBuf>) -> PathBuf {
    named.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("vfscale-fd-child")))
            .unwrap_or_else(|| PathBuf::from("vfscale-fd-child"))
    })
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The first line where two result streams differ, for a report.
fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("step {i}:\n  library: {x}\n  kernel:  {y}");
        }
    }
    format!(
        "the library printed {} lines, the kernel {}",
        a.lines().count(),
        b.lines().count()
    )
}

fn replay(sub: &dyn Subsystem, file: &Path, against: Against) -> Result<ExitCode, String> {
    let text = read(file)?;
    let at = |e: String| format!("{}: {e}", file.display());
    let kernel = || {
        sub.kernel_available()
            .map_err(|why| format!("the kernel target cannot run here: {why}"))?;
        sub.kernel(&text).map_err(at)
    };
    match against {
        Against::Library => print!("{}", sub.library(&text).map_err(at)?),
        Against::Kernel => print!("{}", kernel()?),
        Against::Both => {
            let lib = sub.library(&text).map_err(at)?;
            let ker = kernel()?;
            print!("{lib}");
            if lib != ker {
                eprintln!(
                    "{}: results differ at {}",
                    file.display(),
                    first_difference(&lib, &ker)
                );
                return Ok(ExitCode::from(1));
            }
            eprintln!("{}: library and kernel agree", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            if e.is_dir() || e.extension().is_some_and(|x| x == "jsonl") {
                collect(&e, out)?;
            }
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn check(sub: &dyn Subsystem, paths: &[PathBuf]) -> Result<ExitCode, String> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files)?;
    }
    if files.is_empty() {
        return Err("no *.jsonl scenarios found".into());
    }
    sub.kernel_available()
        .map_err(|why| format!("the kernel target cannot run here: {why}"))?;
    let (mut same, mut differ) = (0, 0);
    for f in &files {
        let text = read(f)?;
        let at = |e: String| format!("{}: {e}", f.display());
        let lib = sub.library(&text).map_err(at)?;
        let ker = sub.kernel(&text).map_err(at)?;
        if lib == ker {
            same += 1;
            println!("same    {}", f.display());
        } else {
            differ += 1;
            println!("DIFFER  {}: {}", f.display(), first_difference(&lib, &ker));
        }
    }
    println!("{same} agree, {differ} differ, of {} scenarios", files.len());
    Ok(if differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `vfscale locks replay FILE [--against library|kernel|both]`.
pub fn locks_replay(a: &ReplayArgs) -> Result<ExitCode, String> {
    replay(&Locks(lock_settings(a.wake)), &a.file, a.against)
}

/// `vfscale locks check PATH...`.
pub fn locks_check(a: &CheckArgs) -> Result<ExitCode, String> {
    check(&Locks(lock_settings(a.wake)), &a.paths)
}

/// `vfscale fd replay FILE [--against library|kernel|both]`.
pub fn fd_replay(a: &FdReplayArgs) -> Result<ExitCode, String> {
    replay(
        &Fds {
            child: fd_child(&a.child),
        },
        &a.file,
        a.against,
    )
}

/// `vfscale fd check PATH...`.
pub fn fd_check(a: &FdCheckArgs) -> Result<ExitCode, String> {
    check(
        &Fds {
            child: fd_child(&a.child),
        },
        &a.paths,
    )
}

//! The kernel runner leaves the machine in the starting state (devices 0-7, unbound,
//! fresh, nothing else) even when a replay fails half-way or is interrupted. Needs root
//! and `/dev/loop-control`; prints `SKIP` otherwise.

mod common;

use vfscale_conformance::loop_dev::{kernel, Scenario};

use common::say;

/// A scenario that binds devices (one stacked on another, one read-only so it stays
/// non-fresh), adds and removes devices, and leaves handles open.
const MESS: &str = r#"# leave a mess
{"op":"backing","name":"a","size":65536,"mode":"rw"}
{"op":"backing","name":"b","size":65536,"mode":"ro"}
{"op":"open","dev":0,"handle":"h0","mode":"rw","excl":true}
{"op":"set_fd","handle":"h0","backing":"a"}
{"op":"open","dev":1,"handle":"h1","mode":"rw"}
{"op":"configure","handle":"h1","backing_handle":"h0","flags":["READ_ONLY"]}
{"op":"open","dev":2,"handle":"h2","mode":"rw"}
{"op":"set_fd","handle":"h2","backing":"b"}
{"op":"ctl_add","index":40}
{"op":"ctl_add","index":-1}
{"op":"open","dev":40,"handle":"h40","mode":"rw"}
{"op":"open","dev":3,"handle":"h3","mode":"rw"}
{"op":"close","handle":"h3"}
{"op":"ctl_remove","index":3}
{"op":"write","handle":"h0","offset":0,"len":4096,"byte":1}
"#;

fn expect_start() {
    let reg = kernel::registry().unwrap();
    let want: Vec<(u32, Option<String>)> = (0..8).map(|i| (i, None)).collect();
    assert_eq!(reg.into_iter().collect::<Vec<_>>(), want);
    kernel::check_starting_state().expect("fresh starting state");
}

#[test]
fn kernel_runner_restores_after_a_failing_step_and_an_interrupt() {
    if let Err(why) = kernel::available() {
        say(&format!("SKIP: loop kernel runner clean-up: {why}"));
        return;
    }
    // A step that names an unknown handle fails the replay half-way.
    let failing = format!("{MESS}{}\n", r#"{"op":"close","handle":"nope"}"#);
    let err = kernel::replay(&Scenario::parse(&failing).unwrap()).unwrap_err();
    assert!(err.to_string().contains("unknown handle \"nope\""), "{err}");
    expect_start();

    // A scenario error inside a step's argument handling (unknown backing) too.
    let failing = format!("{MESS}{}\n", r#"{"op":"set_fd","handle":"h40","backing":"zz"}"#);
    assert!(kernel::replay(&Scenario::parse(&failing).unwrap()).is_err());
    expect_start();

    // An interrupt (what the CLI's SIGINT handler requests) stops the replay before its
    // next step; the runner restores the machine. Run in its own thread-free window:
    // this test binary has one test, so the flag reaches no other replay.
    let ok = kernel::replay(&Scenario::parse(MESS).unwrap()).unwrap();
    assert_eq!(ok.len(), 15);
    expect_start();
    kernel::request_stop();
    let err = kernel::replay(&Scenario::parse(MESS).unwrap()).unwrap_err();
    assert!(err.to_string().contains("interrupted"), "{err}");
    expect_start();
    say("loop kernel runner: starting state restored after a failure and an interrupt");
}

//! `vfscale locks replay|check` and `vfscale fd replay|check`: scenarios replayed against
//! the library, the kernel, or both.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vfscale_locks::{Settings, WakeMode};

use crate::cli::{Against, CheckArgs, FdCheckArgs, FdReplayArgs, ReplayArgs, Wake};
use crate::corpus::{self, first_difference, read};

/// A scenario format with its two runners; each returns the rendered result lines.
trait Subsystem {
    /// Why the kernel runner cannot run here, if it cannot.
    fn kernel_available(&self) -> Result<(), String>;
    /// Parses `text` and replays it against the library.
    fn library(&self, text: &str) -> Result<String, String>;
    /// Parses `text` and replays it against the kernel.
    fn kernel(&self, text: &str) -> Result<String, String>;
    /// Where the library's results `lib` and the kernel's `ker` for scenario `text`
    /// differ, if they do.
    fn difference(&self, _text: &str, lib: &str, ker: &str) -> Result<Option<String>, String> {
        Ok((lib != ker).then(|| first_difference(lib, ker)))
    }
    /// Whether a check can judge scenario `text` where the kernel target runs; `Err`
    /// says why not.
    fn judgeable(&self, _text: &str) -> Result<(), String> {
        Ok(())
    }
}

struct Locks {
    settings: Settings,
    kernel: vfscale_conformance::locks::KernelOptions,
    /// The kernel target's directories share one lock space, so its results must be one
    /// directory's however many there are.
    one_lock_space: bool,
}

impl Locks {
    fn new(wake: Wake, dirs: &[PathBuf], one_lock_space: bool) -> Result<Locks, String> {
        for d in dirs {
            if let Err(e) = std::fs::read_dir(d) {
                return Err(format!(
                    "--dir {}: not a directory to replay in: {e}",
                    d.display()
                ));
            }
        }
        Ok(Locks {
            settings: lock_settings(wake),
            kernel: vfscale_conformance::locks::KernelOptions::in_dirs(dirs),
            one_lock_space,
        })
    }

    /// Whether the kernel target is a mixed replay (a source and mounts mirroring their
    /// locks on it), judged by the rules of `vfscale_conformance::locks::mixed`.
    fn mixed(&self) -> bool {
        !self.one_lock_space && self.kernel.dir.iter().count() + self.kernel.views.len() >= 2
    }
}

impl Subsystem for Locks {
    fn kernel_available(&self) -> Result<(), String> {
        vfscale_conformance::locks::kernel::available()
    }
    fn library(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::locks::{library, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        library::replay_with(&scn, self.settings)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
    fn kernel(&self, text: &str) -> Result<String, String> {
        use vfscale_conformance::locks::{kernel, render_results, Scenario};
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        kernel::replay_with(&scn, &self.kernel)
            .map(|r| render_results(&r))
            .map_err(|e| e.to_string())
    }
    /// Over several directories, only what a mixed replay is meant for.
    fn judgeable(&self, text: &str) -> Result<(), String> {
        use vfscale_conformance::locks::{mixed, Scenario};
        if !self.mixed() {
            return Ok(());
        }
        mixed::eligible(&Scenario::parse(text).map_err(|e| e.to_string())?)
    }
    /// Over several directories, the rules of a mixed replay
    /// (`vfscale_conformance::locks::mixed`); the steps where they allowed the
    /// server's lock are said on stderr.
    fn difference(&self, text: &str, lib: &str, ker: &str) -> Result<Option<String>, String> {
        use vfscale_conformance::locks::{mixed, Scenario};
        if !self.mixed() {
            return Ok((lib != ker).then(|| first_difference(lib, ker)));
        }
        let scn = Scenario::parse(text).map_err(|e| e.to_string())?;
        // The first directory is the source.
        let dirs = 1 + self.kernel.views.len();
        let c = mixed::compare(&scn, dirs, 0, lib, ker)?;
        for s in &c.server_locks {
            eprintln!("step {s}: F_GETLK on the source saw the server's lock (allowed)");
        }
        let mut d = c.differences.into_iter().map(|(_, d)| d);
        Ok(d.next().map(|first| match d.count() {
            0 => first,
            n => format!("{first}\n  (and {n} more steps)"),
        }))
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
            let difference = sub.difference(&text, &lib, &ker).map_err(at)?;
            return Ok(corpus::report_difference(file, &lib, "kernel", difference));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check(sub: &dyn Subsystem, paths: &[PathBuf]) -> Result<ExitCode, String> {
    let files = corpus::scenario_files(paths)?;
    sub.kernel_available()
        .map_err(|why| format!("the kernel target cannot run here: {why}"))?;
    // Scenarios the kernel target cannot judge where it runs (a mixed replay's cycles)
    // are listed, not replayed.
    let mut judged = Vec::with_capacity(files.len());
    for f in files {
        match sub.judgeable(&read(&f)?) {
            Ok(()) => judged.push(f),
            Err(why) => println!("skipped {} ({why})", f.display()),
        }
    }
    // Scenarios under a `racy/` directory depend on which of several woken waiters the
    // kernel lets win (the format says so): both sides must replay them without error,
    // but their results are not compared.
    let (racy, files): (Vec<PathBuf>, Vec<PathBuf>) = judged
        .into_iter()
        .partition(|f| f.components().any(|c| c.as_os_str() == "racy"));
    for f in &racy {
        let text = read(f)?;
        let at = |e: String| format!("{}: {e}", f.display());
        sub.library(&text).map_err(at)?;
        sub.kernel(&text).map_err(at)?;
        println!("racy    {} (replayed without error; not compared)", f.display());
    }
    corpus::check(&files, |f| {
        let text = read(f)?;
        let at = |e: String| format!("{}: {e}", f.display());
        let lib = sub.library(&text).map_err(at)?;
        let ker = sub.kernel(&text).map_err(at)?;
        sub.difference(&text, &lib, &ker).map_err(at)
    })
}

/// `vfscale locks replay FILE [--against library|kernel|both] [--dir DIR]... [--one-lock-space]`.
pub fn locks_replay(a: &ReplayArgs) -> Result<ExitCode, String> {
    if !a.dirs.is_empty() && a.against == Against::Library {
        return Err("--dir is where the kernel target runs: give --against kernel or both".into());
    }
    let locks = Locks::new(a.wake, &a.dirs, a.one_lock_space)?;
    if locks.mixed() {
        use vfscale_conformance::locks::{mixed, Scenario};
        // Said first: a cycle usually ends a mixed replay with an error.
        if let Ok(Err(why)) = Scenario::parse(&read(&a.file)?).map(|s| mixed::eligible(&s)) {
            eprintln!(
                "note: a mixed replay (a source and its mounts) is meant for POSIX and flock locks \
                 without cycles; here {why} (directories of one lock space: --one-lock-space)"
            );
        }
    }
    replay(&locks, &a.file, a.against)
}

/// `vfscale locks check PATH... [--dir DIR]... [--one-lock-space]`.
pub fn locks_check(a: &CheckArgs) -> Result<ExitCode, String> {
    check(&Locks::new(a.wake, &a.dirs, a.one_lock_space)?, &a.paths)
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

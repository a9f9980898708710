//! `vfscale`: the lab's command line. Thin: parsing lives in `cli`, each command in its
//! own module, the work in the `vfscale_lab` library.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod corpus;
mod icache_cmd;
mod lab_cmd;
mod loop_cmd;
mod replay_cmd;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let r = match args.command {
        cli::Command::Run(a) => lab_cmd::run(&a),
        cli::Command::Bench(a) => lab_cmd::bench(&a),
        cli::Command::Compare(a) => lab_cmd::compare(&a),
        cli::Command::Locks(cli::LocksCommand::Replay(a)) => replay_cmd::locks_replay(&a),
        cli::Command::Locks(cli::LocksCommand::Check(a)) => replay_cmd::locks_check(&a),
        cli::Command::Fd(cli::FdCommand::Replay(a)) => replay_cmd::fd_replay(&a),
        cli::Command::Fd(cli::FdCommand::Check(a)) => replay_cmd::fd_check(&a),
        cli::Command::Loop(c) => loop_cmd::run(c),
        cli::Command::Icache(c) => icache_cmd::run(c),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vfscale: {e}");
            ExitCode::from(2)
        }
    }
}

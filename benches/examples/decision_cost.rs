//! Runs one GCRA contender's decision in a loop, for counting instructions per decision
//! with callgrind — a measure that, unlike time, does not depend on what else the
//! machine is doing.
//!
//! ```text
//! cargo build -p floodgate-benches --profile bench --example decision_cost
//! valgrind --tool=callgrind --toggle-collect='*decide_loop*' --callgrind-out-file=/tmp/cg.out \
//!   target/release/examples/decision_cost floodgate allow 1000000
//! # instructions per decision = the "summary:" line of /tmp/cg.out / 1000000
//! ```
//!
//! Contenders: `floodgate`, `mutex_twin`, `textbook_mutex`, `governor`, `floor`
//! (allow path only); paths: `allow`, `deny`. The same set-up as the criterion suite
//! (`benches/contenders`), validated the same way.

#[path = "../benches/contenders/mod.rs"]
mod contenders;

use contenders::{expect_path, for_each_contender, Contender, Path, Visit};
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the contender called `wanted` `decisions` times.
struct Probe<'a> {
    wanted: &'a str,
    path: Path,
    decisions: u64,
    found: bool,
}

impl Visit for Probe<'_> {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C) {
        if name != self.wanted {
            return;
        }
        self.found = true;
        let unexpected = decide_loop(&contender, self.path == Path::Allow, self.decisions);
        expect_path(name, self.path, unexpected);
    }
}

/// The measured loop, kept out of line so that callgrind can count it alone
/// (`--toggle-collect='*decide_loop*'`): the clock's one-time calibration, which spins
/// for a wall-clock interval and so executes a varying number of instructions, stays
/// out of the count. Returns how many decisions went against `expected`.
#[inline(never)]
fn decide_loop<C: Contender>(contender: &C, expected: bool, decisions: u64) -> u64 {
    let mut unexpected = 0u64;
    for _ in 0..decisions {
        if contender.decide() != expected {
            unexpected += 1;
        }
    }
    unexpected
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: decision_cost <floodgate|mutex_twin|textbook_mutex|governor|floor> \
                 <allow|deny> <decisions>";
    let [wanted, path, decisions] = args.as_slice() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let path = match path.as_str() {
        "allow" => Path::Allow,
        "deny" => Path::Deny,
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let Ok(decisions) = decisions.parse::<u64>() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let mut probe = Probe {
        wanted,
        path,
        decisions,
        found: false,
    };
    for_each_contender(path, path == Path::Allow, &mut probe);
    if !probe.found {
        eprintln!(
            "no contender {wanted:?} on the {} path; {usage}",
            path.name()
        );
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

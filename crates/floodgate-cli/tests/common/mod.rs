//! What the tests that run the built `floodgate` binary on an input file share.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `floodgate replay <args> FILE`, the file (one per call) holding `input`: a file,
/// not a pipe, as the binary stops reading at a bad line. The name carries the
/// process id beside a per-process call counter: two runs of a test binary at once
/// (two `cargo test`s on one target dir, or a runner with a process per test) wrote
/// each other's inputs into the same file and read the wrong lines or a file cut
/// short. The file is removed after the run, so they do not pile up under
/// `target/tmp`.
pub fn replay_file(args: &[&str], input: &[u8]) -> Output {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "replay-{}-{}.input",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    );
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&file, input).expect("the input file is written");
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("replay")
        .args(args)
        .arg(&file)
        .output()
        .expect("the floodgate binary runs");
    let _ = std::fs::remove_file(&file);
    output
}

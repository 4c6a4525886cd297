//! Running the bench binary from a story: its report (stdout), once it has succeeded.

use std::process::Command;

/// Runs `drover-bench` with `args` and `--dir` a fresh directory; its stdout and stderr, after asserting success.
pub fn run_bench(args: &[&str]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drover-bench"))
        .args(args)
        .arg("--dir")
        .arg(dir.path().join("cluster"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the bench failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

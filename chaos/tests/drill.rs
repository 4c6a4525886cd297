//! The drills CI runs on every change: `drover-chaos run chaos/drills/smoke.toml` against a local cluster of real
//! processes, the leader killed twice under a checkpointing workload, and `chaos/drills/upgrade.toml`, a rolling
//! upgrade from the previous release, a rollback, the upgrade again and its finalization. Each must keep every
//! promise, and leave the history, the report and the timeline behind.

use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_smoke_drill_kills_the_leader_twice_and_every_promise_holds() {
    if !is_root() {
        eprintln!("SKIPPED: drills need root for iptables (CI runs as root)");
        return;
    }
    let (dir, stdout) = run_drill("smoke");
    for line in ["faults injected      2 (kill x2)", "lost acknowledged    0", "invariants           all kept"] {
        assert!(stdout.contains(line), "{line:?} missing from the report:\n{stdout}");
    }
    let results = dir.path().join("drill/results");
    let report = std::fs::read_to_string(results.join("report.txt")).unwrap();
    assert!(report.contains("failover             p50 "), "{report}");
    let svg = std::fs::read_to_string(results.join("timeline.svg")).unwrap();
    assert_eq!(svg.matches("<title>kill leader replica").count(), 2, "both kills on the timeline");

    // The saved history judges the same way a second time (the checker is a pure function of it).
    let check = Command::new(env!("CARGO_BIN_EXE_drover-chaos"))
        .arg("check")
        .arg(results.join("history.jsonl"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    // Nothing is left behind: no firewall rule of the drill's cluster, no process.
    let rules = Command::new("iptables").args(["-S", "INPUT"]).output().unwrap();
    let cluster = std::fs::read_to_string(dir.path().join("drill/cluster/ip_base")).unwrap();
    assert!(!String::from_utf8_lossy(&rules.stdout).contains(cluster.trim()), "rules left behind");
}

#[test]
fn the_upgrade_drill_rolls_forward_back_and_forward_and_finalizes_with_every_promise_kept() {
    if !is_root() {
        eprintln!("SKIPPED: drills need root for iptables (CI runs as root)");
        return;
    }
    let (_dir, stdout) = run_drill("upgrade");
    for line in [
        "rolling upgrade to this build",
        "rolling back to the previous release",
        "finalize: feature level 2",
        "lost acknowledged    0",
        "restarts             0 incarnations after the first",
        "invariants           all kept",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from the report:\n{stdout}");
    }
}

/// Runs `chaos/drills/NAME.toml` in a new directory (`drill/` inside it) and returns the directory and the report;
/// a failed drill fails the test with its output and every log's tail.
fn run_drill(name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let drill = format!("{}/drills/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_drover-chaos"))
        .args(["run", &drill, "--dir"])
        .arg(dir.path().join("drill"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the drill failed:\n{stdout}\n{stderr}\n{}", log_tails(&dir.path().join("drill")));
    (dir, stdout)
}

/// The last lines of every log under `dir`: the temporary directory goes with the test, and a failure in CI must
/// still say which process did what.
fn log_tails(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                // Not the frames of a backtrace: a process that ended with an error prints its message above
                // thirty lines of them, which were all a tail of 20 showed (the upgrade drill's lost agent error).
                let frame = |l: &&str| {
                    let t = l.trim_start();
                    t.starts_with("at ") || t.split_once(": ").is_some_and(|(n, _)| n.parse::<u32>().is_ok())
                };
                let lines: Vec<&str> = text.lines().filter(|l| !frame(l)).collect();
                let tail = &lines[lines.len().saturating_sub(20)..];
                out.push_str(&format!("--- {} (last {} lines)\n{}\n", path.display(), tail.len(), tail.join("\n")));
            }
        }
    }
    out
}

#[test]
fn a_broken_history_fails_the_check_command_with_the_violation_named() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    // Job 7 acknowledged, then missing from the final listing: a lost acknowledged submission.
    std::fs::write(
        &history,
        "{\"at_ms\":1,\"event\":\"submit_sent\",\"op\":1}\n{\"at_ms\":2,\"event\":\"submit_acked\",\"op\":1,\"job\":7}\n\
         {\"at_ms\":9,\"event\":\"final_jobs\",\"jobs\":[]}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drover-chaos")).arg("check").arg(&history).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("job 7") && stdout.contains("1 violations"), "{stdout}");
}

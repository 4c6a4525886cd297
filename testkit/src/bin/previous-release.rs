//! Builds the previous release's controller and agent for the upgrade drill (`drover_testkit::previous`) into
//! this workspace's own target directory, so only its crates compile and its dependencies are reused. Run it
//! before the tests (`.ci/run` does), never beside them: the build replaces `target/debug/drover-controller` and
//! `drover-agent` for a moment, until the tests' own build puts this build's back.

//!
//! `--release` builds the release profile instead, for the benchmarks (`drover-bench restarts --previous`).

fn main() -> anyhow::Result<()> {
    use drover_testkit::previous::Profile;
    let profile = match std::env::args().nth(1).as_deref() {
        None => Profile::Debug,
        Some("--release") => Profile::Release,
        Some(other) => anyhow::bail!("unknown argument {other:?} (usage: previous-release [--release])"),
    };
    let target = drover_testkit::previous::target_dir();
    drover_testkit::previous::build_into(&target, &target, profile)?;
    println!(
        "previous release {} ({}) built under {}",
        drover_testkit::previous::VERSION,
        drover_testkit::previous::COMMIT,
        target.join("previous").display()
    );
    Ok(())
}

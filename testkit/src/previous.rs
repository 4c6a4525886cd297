//! The previous release's `drover-controller` and `drover-agent`, for the upgrade drill: built from a fixed commit
//! of this repository's own history, so the drill rolls a cluster between two real builds.
//!
//! Why a build and not a fixture of the old data directory and wire messages: the drill's questions are whether
//! an old replica follows a log that new leaders write, whether it can lead new followers, and whether old agents
//! keep their leases across new controllers. Only the old code answers those; recorded bytes would test only what
//! someone thought to record.
//!
//! The build lands in `<target>/previous/<commit>/bin` and is reused. A fresh clone builds it once (the compiled
//! dependencies are reused when the build shares the main target directory: `.ci/run` does that before the tests,
//! see `build_into`); a test that finds no build makes one in a target directory of its own, which takes longer
//! but never touches the binaries other tests are running.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The previous release: the last commit of 0.1.0 that landed (before feature levels).
pub const COMMIT: &str = "b0fd8f7a206cc1b5144e2ec143313dd63893bb3f";
/// Its version, as its agents report it (`NodeInfo::version`).
pub const VERSION: &str = "0.1.0";

/// The binaries the drill swaps.
const BINARIES: [&str; 2] = ["drover-controller", "drover-agent"];

/// The build profile of the previous release's binaries: the tests run debug builds, the benchmarks release
/// builds (a comparison between the two releases is only fair within one profile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

impl Profile {
    fn dir(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::Release => "release",
        }
    }
}

/// The directory holding the previous release's debug binaries, building them first if needed.
/// `DROVER_PREVIOUS_BIN` names a directory that already holds them.
pub fn binaries() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DROVER_PREVIOUS_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let target = target_dir();
    let bin = bin_dir(&target, Profile::Debug);
    if complete(&bin) {
        return Ok(bin);
    }
    // A target directory of its own: building into the shared one would swap the binaries other tests run.
    build_into(&target.join("previous").join("target"), &target, Profile::Debug)?;
    Ok(bin)
}

/// The previous release's release-profile binaries, for the benchmarks; built beforehand with
/// `target/release/previous-release --release` (which shares the release target directory, so it must not run
/// beside a benchmark).
pub fn release_binaries() -> anyhow::Result<PathBuf> {
    let bin = bin_dir(&target_dir(), Profile::Release);
    if !complete(&bin) {
        bail!(
            "the previous release's release build is not in {}: run `cargo build --release -p drover-testkit --bin \
             previous-release && target/release/previous-release --release`, then build this one's binaries again \
             (`cargo build --release`)",
            bin.display()
        );
    }
    Ok(bin)
}

/// Builds the previous release with `cargo_target` as its target directory and puts its binaries under
/// `target/previous/<commit>/<profile>-bin`. One build at a time (a lock file); a finished one is kept.
pub fn build_into(cargo_target: &Path, target: &Path, profile: Profile) -> anyhow::Result<()> {
    let bin = bin_dir(target, profile);
    let root = bin.parent().expect("bin has a parent").to_path_buf();
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let lock = std::fs::File::create(root.join("lock"))?;
    // SAFETY: flock on a file this function holds open.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        bail!("cannot lock {}", root.join("lock").display());
    }
    if complete(&bin) {
        return Ok(());
    }
    let workspace = workspace_root();
    let has_commit = Command::new("git")
        .arg("-C")
        .arg(&workspace)
        .args(["cat-file", "-e", &format!("{COMMIT}^{{commit}}")])
        .status()
        .context("cannot run git")?;
    if !has_commit.success() {
        bail!(
            "the repository at {} lacks commit {COMMIT}, the previous release (a shallow clone?): fetch it, or set \
             DROVER_PREVIOUS_BIN to a directory holding that release's drover-controller and drover-agent",
            workspace.display()
        );
    }
    let src = root.join("src");
    if src.exists() {
        std::fs::remove_dir_all(&src)?;
    }
    std::fs::create_dir_all(&src)?;
    let archive = Command::new("sh")
        .arg("-c")
        .arg(format!("git -C \"$0\" archive {COMMIT} | tar -x -C \"$1\""))
        .arg(&workspace)
        .arg(&src)
        .status()
        .context("cannot run git archive")?;
    if !archive.success() {
        bail!("git archive of {COMMIT} into {} failed", src.display());
    }
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    build.current_dir(&src).args(["build", "--locked", "--bins"]);
    if profile == Profile::Release {
        build.arg("--release");
    }
    for binary in BINARIES {
        build.args(["-p", binary]);
    }
    let status = build.env("CARGO_TARGET_DIR", cargo_target).status().context("cannot run cargo")?;
    if !status.success() {
        bail!("building the previous release ({COMMIT}) in {} failed", src.display());
    }
    std::fs::create_dir_all(&bin)?;
    for binary in BINARIES {
        let built = cargo_target.join(profile.dir()).join(binary);
        std::fs::copy(&built, bin.join(binary)).with_context(|| format!("cannot copy {}", built.display()))?;
    }
    std::fs::write(bin.join("COMMIT"), COMMIT)?;
    let _ = std::fs::remove_dir_all(&src);
    Ok(())
}

fn complete(bin: &Path) -> bool {
    BINARIES.iter().all(|b| bin.join(b).is_file())
        && std::fs::read_to_string(bin.join("COMMIT")).is_ok_and(|c| c == COMMIT)
}

fn bin_dir(target: &Path, profile: Profile) -> PathBuf {
    let name = match profile {
        Profile::Debug => "bin".to_string(),
        Profile::Release => "release-bin".to_string(),
    };
    target.join("previous").join(COMMIT).join(name)
}

/// The workspace's target directory (`CARGO_TARGET_DIR`, else `target/` beside the workspace's manifest).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target"),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit sits in the workspace").to_path_buf()
}

//! Where the leader was last seen, remembered across processes: a shell loop of `sbatch` would otherwise send
//! every submission to the first controller in the list and, when that one follows, pay a forwarding hop each
//! time. The file names one address; a stale or foreign entry costs at most one redirect (a follower forwards or
//! hints), and an entry that is not among the configured controllers is ignored.
//!
//! One small file per user and controller list, under `$XDG_RUNTIME_DIR/drover/` (else `~/.cache/drover/`),
//! written only when the leader changes, by rename so a reader never sees half of it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;

/// An address is a host:port; anything longer is not ours.
const MAX_HINT_BYTES: u64 = 512;

/// The hint file for one list of controllers, or `None` when this user has no private directory to keep it in.
pub fn path(addresses: &[String]) -> Option<PathBuf> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("drover"),
        None => PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty())?).join(".cache").join("drover"),
    };
    let mut sorted = addresses.to_vec();
    sorted.sort();
    let mut hasher = DefaultHasher::new();
    sorted.hash(&mut hasher);
    Some(dir.join(format!("leader-{:016x}", hasher.finish())))
}

/// The remembered leader's position in `addresses`, if there is one.
pub fn load(addresses: &[String]) -> Option<usize> {
    let path = path(addresses)?;
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > MAX_HINT_BYTES {
        return None;
    }
    let text = std::io::read_to_string(file).ok()?;
    addresses.iter().position(|a| a == text.trim())
}

/// Remembers `leader` for the next process; best effort (a read-only home only costs the next one a redirect).
pub fn store(addresses: &[String], leader: &str) {
    let Some(path) = path(addresses) else { return };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".leader-{}.tmp", std::process::id()));
    if std::fs::write(&tmp, leader).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_depends_on_the_set_of_controllers_not_their_order() {
        let a = vec!["10.0.0.1:1".to_string(), "10.0.0.2:1".to_string()];
        let b = vec!["10.0.0.2:1".to_string(), "10.0.0.1:1".to_string()];
        let c = vec!["10.0.0.1:1".to_string()];
        if let (Some(pa), Some(pb), Some(pc)) = (path(&a), path(&b), path(&c)) {
            assert_eq!(pa, pb);
            assert_ne!(pa, pc);
        }
    }
}

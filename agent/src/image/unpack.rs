//! Applying layer archives to a root file system, as root, without ever writing outside it.
//!
//! Paths are resolved here rather than by the `tar` crate's `unpack_in`: every directory component is looked at with
//! `lstat`, a symbolic link met on the way is followed *inside* the root (an absolute target restarts at the root, `..`
//! stops at it, as if the image were chrooted, which is how docker applies layers), and the last component is never
//! followed (whatever is there is removed first, then the entry is created with `O_NOFOLLOW`/`O_EXCL`). The tree
//! being written lives in a root-only (0700) directory, so nothing else changes it between the check and the write.
//!
//! Ownership and permission bits (setuid included: the image is mounted nosuid) are kept; extended attributes are
//! never written, since a `security.capability` xattr would hand a program privileges; block and character devices
//! are skipped (counted and logged).

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Most entries in one layer: real layers hold up to a few hundred thousand files.
pub(crate) const MAX_LAYER_ENTRIES: u64 = 10_000_000;
/// Most symbolic links followed while resolving one path (Linux's own limit).
const MAX_SYMLINK_FOLLOWS: usize = 40;
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_WHITEOUT: &[u8] = b".wh..wh..opq";

/// Why a layer could not be applied: the layer is malformed or hostile, or the disk failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnpackError {
    #[error("{0}")]
    Bad(String),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("the layer does not match its digest (expected {expected}, got {actual})")]
    Digest { expected: String, actual: String },
}

/// How a layer from a file the user controls is checked. The check is made on the very bytes each pass applies (not
/// in a pass of its own), so a file changed between passes fails the import instead of slipping content past the
/// digest that names the cache entry.
#[derive(Debug, Clone)]
pub(crate) enum LayerCheck {
    /// sha256 of the layer as stored (an OCI blob).
    Stored(String),
    /// sha256 of the decompressed tar (docker's `diff_id`).
    Uncompressed(String),
}

/// Feeds what is read through it to a hasher shared with the caller (the tar reader owns the stream).
struct Hashing<R> {
    inner: R,
    hasher: Rc<RefCell<Sha256>>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.borrow_mut().update(&buf[..n]);
        Ok(n)
    }
}

/// One pass's tar stream, hashed where `check` asks.
fn pass_stream<'a, R: Read + 'a>(
    raw: R,
    check: Option<&LayerCheck>,
    hasher: &Rc<RefCell<Sha256>>,
) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match check {
        None => decompressed(raw)?,
        Some(LayerCheck::Stored(_)) => decompressed(Hashing { inner: raw, hasher: hasher.clone() })?,
        Some(LayerCheck::Uncompressed(_)) => Box::new(Hashing { inner: decompressed(raw)?, hasher: hasher.clone() }),
    })
}

/// Reads what the tar reader left (end-of-archive blocks, padding) so the whole layer is hashed, then compares.
fn finish_pass(
    rest: &mut dyn Read,
    check: Option<&LayerCheck>,
    hasher: &Rc<RefCell<Sha256>>,
) -> Result<(), UnpackError> {
    let Some(check) = check else { return Ok(()) };
    io::copy(rest, &mut io::sink()).map_err(io_error(|| "cannot read the layer".into()))?;
    let actual = format!("sha256:{}", super::hex(&hasher.replace(Sha256::new()).finalize()));
    let expected = match check {
        LayerCheck::Stored(d) | LayerCheck::Uncompressed(d) => d,
    };
    if &actual != expected {
        return Err(UnpackError::Digest { expected: expected.clone(), actual });
    }
    Ok(())
}

fn io_error(context: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> UnpackError {
    move |source| UnpackError::Io { context: context(), source }
}

/// What applying one layer did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub devices_skipped: u64,
}

/// Compression of a layer, told from its first bytes (docker archives carry no media types, and registries have been
/// seen to mislabel them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

pub(crate) fn sniff(prefix: &[u8]) -> Compression {
    if prefix.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if prefix.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// The layer's tar stream, decompressed as its first bytes say.
pub(crate) fn decompressed<'a, R: Read + 'a>(raw: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut reader = BufReader::with_capacity(256 * 1024, raw);
    let kind = sniff(reader.fill_buf()?);
    Ok(match kind {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(reader)?),
    })
}

/// Applies one layer to `root`. `open` gives the layer's (possibly compressed) bytes from the start; it is called
/// twice, since whiteouts must be applied before any of the layer's own entries (a layer may whiteout `a/x` after
/// adding `a/y`, and `.wh..wh..opq` empties a directory of lower content only).
pub(crate) fn apply_layer<R: Read>(
    root: &Path,
    mut open: impl FnMut() -> io::Result<R>,
    check: Option<&LayerCheck>,
) -> Result<LayerStats, UnpackError> {
    let mut stats = LayerStats::default();
    let hasher = Rc::new(RefCell::new(Sha256::new()));
    let mut pass = || -> Result<tar::Archive<Box<dyn Read>>, UnpackError> {
        let raw = open().map_err(io_error(|| "cannot open the layer".into()))?;
        let stream = pass_stream(raw, check, &hasher).map_err(io_error(|| "cannot read the layer".into()))?;
        Ok(tar::Archive::new(stream))
    };

    let mut archive = pass()?;
    let whiteouts = collect_whiteouts(&mut archive, &mut stats)?;
    finish_pass(&mut archive.into_inner(), check, &hasher)?;
    for (dir, name) in &whiteouts {
        stats.whiteouts += 1;
        apply_whiteout(root, dir, name.as_deref())?;
    }

    let mut archive = pass()?;
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let mut count = 0u64;
    for entry in archive.entries().map_err(io_error(|| "cannot read the layer".into()))? {
        let mut entry = entry.map_err(io_error(|| "cannot read the layer's tar stream".into()))?;
        count += 1;
        if count > MAX_LAYER_ENTRIES {
            return Err(UnpackError::Bad(format!("a layer holds more than {MAX_LAYER_ENTRIES} entries")));
        }
        let kind = entry.header().entry_type();
        if kind.is_block_special() || kind.is_character_special() {
            stats.devices_skipped += 1;
            continue;
        }
        create_entry(root, &mut entry, is_root)?;
    }
    finish_pass(&mut archive.into_inner(), check, &hasher)?;
    if stats.devices_skipped > 0 {
        tracing::info!(count = stats.devices_skipped, "skipped device nodes in an image layer");
    }
    Ok(stats)
}

/// A whiteout: the directory's components, and the name it deletes (`None`: the opaque marker, everything).
type Whiteout = (Vec<OsString>, Option<OsString>);

/// Pass 1: the layer's whiteouts, in order.
fn collect_whiteouts<R: Read>(
    archive: &mut tar::Archive<R>,
    stats: &mut LayerStats,
) -> Result<Vec<Whiteout>, UnpackError> {
    let mut whiteouts = Vec::new();
    for entry in archive.entries().map_err(io_error(|| "cannot read the layer".into()))? {
        let entry = entry.map_err(io_error(|| "cannot read the layer's tar stream".into()))?;
        stats.entries += 1;
        if stats.entries > MAX_LAYER_ENTRIES {
            return Err(UnpackError::Bad(format!("a layer holds more than {MAX_LAYER_ENTRIES} entries")));
        }
        let components = entry_components(&entry.path_bytes())?;
        let Some((name, parent)) = components.split_last() else { continue };
        let name = name.as_bytes();
        if name == OPAQUE_WHITEOUT {
            whiteouts.push((parent.to_vec(), None));
        } else if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) {
            // `.wh..wh.*` other than the opaque marker are aufs bookkeeping, not deletions.
            if !target.starts_with(WHITEOUT_PREFIX) && !target.is_empty() {
                whiteouts.push((parent.to_vec(), Some(OsStr::from_bytes(target).to_os_string())));
            }
        }
    }
    Ok(whiteouts)
}

/// Deletes `name` (or, for the opaque marker, everything) in the directory `dir` names, if it is there.
fn apply_whiteout(root: &Path, dir: &[OsString], name: Option<&OsStr>) -> Result<(), UnpackError> {
    let Some(dir) = resolve_dir(root, dir, false)? else { return Ok(()) };
    match name {
        None => {
            let children = fs::read_dir(&dir).map_err(io_error(|| format!("cannot list {}", dir.display())))?;
            for child in children {
                let child = child.map_err(io_error(|| format!("cannot list {}", dir.display())))?;
                remove_any(&child.path())?;
            }
            Ok(())
        }
        Some(name) => remove_any(&dir.join(name)),
    }
}

/// Pass 2, one entry: whatever is at its path goes (unless both are directories), then the entry is created.
fn create_entry<R: Read>(root: &Path, entry: &mut tar::Entry<'_, R>, is_root: bool) -> Result<(), UnpackError> {
    let components = entry_components(&entry.path_bytes())?;
    if components.last().is_some_and(|n| n.as_bytes().starts_with(WHITEOUT_PREFIX)) {
        return Ok(());
    }
    let kind = entry.header().entry_type();
    let (uid, gid) = owner(entry)?;
    let mode = entry.header().mode().unwrap_or(if kind.is_dir() { 0o755 } else { 0o644 }) & 0o7777;
    let mtime = entry.header().mtime().unwrap_or(0);
    let Some((name, parent)) = components.split_last() else {
        // The root directory itself (`./`): only its owner and mode matter.
        if kind.is_dir() {
            set_owner_mode(root, uid, gid, mode, is_root, true)?;
        }
        return Ok(());
    };
    let parent = resolve_dir(root, parent, true)?.ok_or_else(|| UnpackError::Bad("unreachable parent".into()))?;
    let dst = parent.join(name);
    let existing = fs::symlink_metadata(&dst).ok();
    if let Some(existing) = &existing
        && !(kind.is_dir() && existing.is_dir())
    {
        remove_any(&dst)?;
    }
    let at = || format!("cannot create {}", dst.display());
    if kind.is_dir() {
        if existing.as_ref().is_none_or(|m| !m.is_dir()) {
            fs::create_dir(&dst).map_err(io_error(at))?;
        }
        set_owner_mode(&dst, uid, gid, mode, is_root, true)?;
    } else if kind.is_file() || kind == tar::EntryType::Continuous || kind.is_gnu_sparse() {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dst)
            .map_err(io_error(at))?;
        io::copy(entry, &mut file).map_err(io_error(|| format!("cannot write {}", dst.display())))?;
        if is_root {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_error(at))?;
        }
        file.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_error(at))?;
        set_mtime(&dst, mtime);
    } else if kind.is_symlink() {
        let target = entry.link_name_bytes().ok_or_else(|| UnpackError::Bad("a symlink without a target".into()))?;
        // The target is stored as written: it is only ever resolved inside the container (or, here, inside the root
        // by `resolve_dir`).
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), &dst).map_err(io_error(at))?;
        if is_root {
            std::os::unix::fs::lchown(&dst, Some(uid), Some(gid)).map_err(io_error(at))?;
        }
        set_mtime(&dst, mtime);
    } else if kind.is_hard_link() {
        create_hard_link(root, entry, &dst)?;
    } else if kind.is_fifo() {
        let path = cstring(&dst)?;
        // SAFETY: `path` is a valid C string.
        if unsafe { libc::mkfifo(path.as_ptr(), 0o600) } != 0 {
            return Err(io_error(at)(io::Error::last_os_error()));
        }
        set_owner_mode(&dst, uid, gid, mode, is_root, false)?;
    } else {
        // pax global headers and the like carry nothing to create.
        tracing::debug!(path = %dst.display(), kind = ?kind, "skipping a layer entry of an unsupported type");
    }
    Ok(())
}

/// A hard link to an earlier file of the image: its target is resolved inside the root like any other path.
fn create_hard_link<R: Read>(root: &Path, entry: &tar::Entry<'_, R>, dst: &Path) -> Result<(), UnpackError> {
    let target = entry.link_name_bytes().ok_or_else(|| UnpackError::Bad("a hard link without a target".into()))?;
    let target_components = entry_components(&target)?;
    let Some((target_name, target_parent)) = target_components.split_last() else {
        return Err(UnpackError::Bad("a hard link to the root directory".into()));
    };
    let source = resolve_dir(root, target_parent, false)?.map(|p| p.join(target_name));
    let Some(source) = source.filter(|s| fs::symlink_metadata(s).is_ok_and(|m| !m.is_dir())) else {
        return Err(UnpackError::Bad(format!(
            "hard link {} points to {}, which is missing or a directory",
            String::from_utf8_lossy(&entry.path_bytes()),
            String::from_utf8_lossy(&target)
        )));
    };
    // `link(2)` does not follow a symbolic link at the source: the link itself is linked.
    fs::hard_link(&source, dst).map_err(io_error(|| format!("cannot create {}", dst.display())))
}

/// The entry's path as components below the root: leading `/` and `.` dropped; `..` refused (no legitimate layer
/// holds one, and tools that write them are attacking the unpacker).
fn entry_components(path: &[u8]) -> Result<Vec<OsString>, UnpackError> {
    let mut out = Vec::new();
    for component in Path::new(OsStr::from_bytes(path)).components() {
        match component {
            Component::Normal(name) => out.push(name.to_os_string()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                return Err(UnpackError::Bad(format!("the path {} leaves the image", String::from_utf8_lossy(path))));
            }
        }
    }
    Ok(out)
}

/// The directory `components` names below `root`, with symbolic links on the way followed inside `root` (as if it
/// were `/`). Missing directories are created when `create` is set (mode 0755, as docker does), otherwise the answer is
/// `None`, as it is when a component is a file and not `create`. The path returned holds no symbolic link.
pub(crate) fn resolve_dir(root: &Path, components: &[OsString], create: bool) -> Result<Option<PathBuf>, UnpackError> {
    let mut queue: VecDeque<OsString> = components.iter().cloned().collect();
    let mut current = root.to_path_buf();
    let mut depth = 0usize;
    let mut follows = 0usize;
    while let Some(name) = queue.pop_front() {
        match name.as_bytes() {
            b"" | b"." => continue,
            b".." => {
                if depth > 0 {
                    current.pop();
                    depth -= 1;
                }
                continue;
            }
            _ => {}
        }
        let next = current.join(&name);
        match fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                follows += 1;
                if follows > MAX_SYMLINK_FOLLOWS {
                    return Err(UnpackError::Bad(format!("too many symbolic links below {}", next.display())));
                }
                let target = fs::read_link(&next).map_err(io_error(|| format!("cannot read {}", next.display())))?;
                if target.is_absolute() {
                    current = root.to_path_buf();
                    depth = 0;
                }
                let mut expanded: VecDeque<OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_os_string()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                expanded.extend(queue);
                queue = expanded;
            }
            Ok(meta) if meta.is_dir() => {
                current = next;
                depth += 1;
            }
            Ok(_) if create => {
                return Err(UnpackError::Bad(format!("{} is not a directory", next.display())));
            }
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&next)
                    .map_err(io_error(|| format!("cannot create {}", next.display())))?;
                current = next;
                depth += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(|| format!("cannot look at {}", next.display()))(e)),
        }
    }
    Ok(Some(current))
}

/// Removes whatever is at `path` without following it: a directory with its contents, anything else alone.
fn remove_any(path: &Path) -> Result<(), UnpackError> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(io_error(|| format!("cannot remove {}", path.display())))
}

/// The entry's owner: the pax `uid`/`gid` records win over the header's (large ids do not fit in ustar).
fn owner<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<(u32, u32), UnpackError> {
    let header = entry.header();
    // An empty numeric field (some writers leave them blank) reads as 0, as Go's archive/tar and GNU tar read it.
    let mut uid = header.uid().unwrap_or(0);
    let mut gid = header.gid().unwrap_or(0);
    if let Ok(Some(extensions)) = entry.pax_extensions() {
        for extension in extensions.flatten() {
            let value = extension.value().ok().and_then(|v| v.parse::<u64>().ok());
            match (extension.key(), value) {
                (Ok("uid"), Some(v)) => uid = v,
                (Ok("gid"), Some(v)) => gid = v,
                _ => {}
            }
        }
    }
    let uid = u32::try_from(uid).map_err(|_| UnpackError::Bad(format!("uid {uid} is out of range")))?;
    let gid = u32::try_from(gid).map_err(|_| UnpackError::Bad(format!("gid {gid} is out of range")))?;
    Ok((uid, gid))
}

/// Owner, then mode (chown clears setuid bits, so it comes first), through a descriptor opened without following a
/// link. Without root the owner cannot be set, and a directory keeps its owner's write bit so the next layers can
/// still be applied (only tests run the store without root).
fn set_owner_mode(path: &Path, uid: u32, gid: u32, mode: u32, is_root: bool, is_dir: bool) -> Result<(), UnpackError> {
    let at = || format!("cannot set the owner or mode of {}", path.display());
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | if is_dir { libc::O_DIRECTORY } else { 0 })
        .open(path)
        .map_err(io_error(at))?;
    if is_root {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_error(at))?;
    }
    let mode = if is_root || !is_dir { mode } else { mode | 0o700 };
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_error(at))
}

/// Keeps the layer's modification time (build tools compare them); failure only loses the time.
fn set_mtime(path: &Path, mtime: u64) {
    let Ok(path) = cstring(path) else { return };
    let when = libc::timespec { tv_sec: mtime.min(i64::MAX as u64) as libc::time_t, tv_nsec: 0 };
    let times = [when, when];
    // SAFETY: `path` is a valid C string and `times` two initialized timespecs, as utimensat(2) requires.
    unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
}

fn cstring(path: &Path) -> Result<CString, UnpackError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| UnpackError::Bad(format!("{} holds a NUL byte", path.display())))
}

/// Removes block and character devices from an unpacked tree (unsquashfs creates them as root); returns how many.
pub(crate) fn remove_device_nodes(root: &Path) -> io::Result<u64> {
    let mut removed = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for child in fs::read_dir(&dir)? {
            let child = child?;
            let kind = child.file_type()?;
            use std::os::unix::fs::FileTypeExt;
            if kind.is_dir() {
                stack.push(child.path());
            } else if kind.is_block_device() || kind.is_char_device() {
                fs::remove_file(child.path())?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Bytes a tree takes on disk (allocated blocks), each hard-linked file once.
pub(crate) fn disk_usage(root: &Path) -> io::Result<u64> {
    let mut total = 0u64;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path)?;
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total = total.saturating_add(meta.blocks().saturating_mul(512));
        if meta.is_dir() {
            for child in fs::read_dir(&path)? {
                stack.push(child?.path());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A layer's entries for tests: (path, kind, contents or link target).
    pub(crate) enum Item<'a> {
        Dir(&'a str),
        File(&'a str, &'a [u8]),
        Symlink(&'a str, &'a str),
        HardLink(&'a str, &'a str),
        CharDevice(&'a str),
    }

    /// A tar layer holding `items`, written without the `tar` builder's path checks (hostile layers need `..`).
    pub(crate) fn layer(items: &[Item<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for item in items {
            let mut header = tar::Header::new_gnu();
            header.set_uid(1234);
            header.set_gid(5678);
            header.set_mtime(1_700_000_000);
            let (path, data): (&str, &[u8]) = match item {
                Item::Dir(p) => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    (p, b"")
                }
                Item::File(p, data) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(0o4755);
                    (p, data)
                }
                Item::Symlink(p, target) | Item::HardLink(p, target) => {
                    header.set_entry_type(if matches!(item, Item::Symlink(..)) {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    });
                    header.set_mode(0o777);
                    let name = header.as_old_mut().linkname.as_mut();
                    name[..target.len()].copy_from_slice(target.as_bytes());
                    (p, b"")
                }
                Item::CharDevice(p) => {
                    header.set_entry_type(tar::EntryType::Char);
                    header.set_mode(0o666);
                    (p, b"")
                }
            };
            let name = header.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_size(data.len() as u64);
            header.set_cksum();
            builder.append(&header, data).expect("append");
        }
        builder.into_inner().expect("finish")
    }

    fn apply(root: &Path, bytes: &[u8]) -> Result<LayerStats, UnpackError> {
        apply_layer(root, || Ok(io::Cursor::new(bytes.to_vec())), None)
    }

    #[test]
    fn checked_layers_must_match_their_digest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = layer(&[Item::File("a", b"a")]);
        let packed = gzip(&plain);
        let digest = |b: &[u8]| format!("sha256:{}", super::super::hex(&Sha256::digest(b)));
        let open = || Ok(io::Cursor::new(packed.clone()));
        apply_layer(dir.path(), open, Some(&LayerCheck::Stored(digest(&packed)))).expect("stored digest");
        apply_layer(dir.path(), open, Some(&LayerCheck::Uncompressed(digest(&plain)))).expect("diff id");
        let error = apply_layer(dir.path(), open, Some(&LayerCheck::Stored(digest(&plain)))).expect_err("wrong");
        assert!(matches!(error, UnpackError::Digest { .. }), "{error}");
        // A file that changes between the two passes fails too.
        let mut calls = 0;
        let changing = || {
            calls += 1;
            Ok(io::Cursor::new(if calls == 1 { packed.clone() } else { gzip(&layer(&[Item::File("a", b"evil")])) }))
        };
        let error = apply_layer(dir.path(), changing, Some(&LayerCheck::Stored(digest(&packed)))).expect_err("changed");
        assert!(matches!(error, UnpackError::Digest { .. }), "{error}");
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).expect("gzip");
        encoder.finish().expect("gzip")
    }

    #[test]
    fn layers_stack_with_file_and_opaque_whiteouts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let lower = layer(&[
            Item::Dir("etc/"),
            Item::File("etc/keep", b"keep"),
            Item::File("etc/gone", b"gone"),
            Item::Dir("opt/"),
            Item::File("opt/old1", b"1"),
            Item::Dir("opt/sub/"),
            Item::File("opt/sub/old2", b"2"),
            Item::Dir("dir-gone/"),
            Item::File("dir-gone/x", b"x"),
        ]);
        apply(root, &gzip(&lower)).expect("lower layer");
        // The whiteouts come after new content in the same directory: they must still only hit lower content.
        let upper = layer(&[
            Item::File("opt/new", b"new"),
            Item::File("opt/.wh..wh..opq", b""),
            Item::File("etc/.wh.gone", b""),
            Item::File(".wh.dir-gone", b""),
            Item::File("etc/.wh.never-existed", b""),
            Item::File("etc/gone-again", b"g"),
        ]);
        let stats = apply(root, &upper).expect("upper layer");
        assert_eq!(stats.whiteouts, 4);
        assert_eq!(fs::read(root.join("etc/keep")).expect("keep"), b"keep");
        assert!(!root.join("etc/gone").exists());
        assert!(!root.join("dir-gone").exists());
        assert!(!root.join("opt/old1").exists() && !root.join("opt/sub").exists());
        assert_eq!(fs::read(root.join("opt/new")).expect("new"), b"new");
        assert!(!root.join("opt/.wh..wh..opq").exists() && !root.join("etc/.wh.gone").exists());
        let meta = fs::metadata(root.join("etc/keep")).expect("meta");
        assert_eq!(meta.mode() & 0o7777, 0o4755, "setuid bit and mode kept");
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
        }
        assert_eq!(meta.mtime(), 1_700_000_000);
    }

    #[test]
    fn file_replaces_directory_and_symlink_replaces_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        apply(root, &layer(&[Item::Dir("a/"), Item::File("a/x", b"x"), Item::File("b", b"b")])).expect("lower");
        apply(root, &layer(&[Item::File("a", b"file now"), Item::Symlink("b", "/etc/passwd")])).expect("upper");
        assert_eq!(fs::read(root.join("a")).expect("a"), b"file now");
        assert_eq!(fs::read_link(root.join("b")).expect("b"), Path::new("/etc/passwd"));
    }

    #[test]
    fn symlink_parent_is_followed_inside_the_root_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        let root = dir.path().join("rootfs");
        fs::create_dir(&root).expect("mkdir");
        let target = outside.path().to_str().expect("utf-8");
        let evil_file = format!("{target}/file");
        let bytes = layer(&[
            Item::Symlink("evil", target),
            Item::File("evil/file", b"pwned"),
            Item::Symlink("up", "../../../.."),
            Item::File("up/escaped", b"pwned"),
            Item::Symlink("lib", "usr/lib"),
            Item::File("lib/libc.so", b"elf"),
        ]);
        apply(&root, &bytes).expect("layer");
        assert!(!Path::new(&evil_file).exists(), "wrote through a symlink out of the root");
        assert!(!dir.path().join("escaped").exists() && !Path::new("/escaped").exists());
        // The same writes land inside the root, where a chrooted unpacker would put them.
        assert_eq!(fs::read(root.join(format!(".{evil_file}"))).expect("inside"), b"pwned");
        assert_eq!(fs::read(root.join("escaped")).expect("clamped at /"), b"pwned");
        assert_eq!(fs::read(root.join("usr/lib/libc.so")).expect("merged usr"), b"elf");
        assert!(fs::read_dir(outside.path()).expect("outside").next().is_none());
    }

    #[test]
    fn a_symlink_as_the_last_component_is_replaced_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        let victim = outside.path().join("victim");
        fs::write(&victim, b"original").expect("victim");
        let root = dir.path().join("rootfs");
        fs::create_dir(&root).expect("mkdir");
        let target = victim.to_str().expect("utf-8");
        apply(&root, &layer(&[Item::Symlink("link", target)])).expect("lower");
        apply(&root, &layer(&[Item::File("link", b"pwned"), Item::File(".wh.nothing", b"")])).expect("upper");
        assert_eq!(fs::read(&victim).expect("victim"), b"original");
        assert_eq!(fs::read(root.join("link")).expect("replaced"), b"pwned");
        // A whiteout through a symlinked directory deletes nothing outside.
        apply(&root, &layer(&[Item::Symlink("d", outside.path().to_str().expect("utf-8"))])).expect("link dir");
        apply(&root, &layer(&[Item::File("d/.wh.victim", b""), Item::File("d/.wh..wh..opq", b"")])).expect("wh");
        assert!(victim.exists());
    }

    #[test]
    fn dot_dot_paths_and_outside_hard_links_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("rootfs");
        fs::create_dir(&root).expect("mkdir");
        let error = apply(&root, &layer(&[Item::File("../escaped", b"x")])).expect_err("..");
        assert!(error.to_string().contains("leaves the image"), "{error}");
        assert!(!dir.path().join("escaped").exists());
        let error = apply(&root, &layer(&[Item::HardLink("shadow", "../../../../etc/shadow")])).expect_err("link ..");
        assert!(error.to_string().contains("leaves the image"), "{error}");
        // An absolute hard-link target is read inside the root: /etc/hostname of the image, which is not there.
        let error = apply(&root, &layer(&[Item::HardLink("host", "/etc/hostname")])).expect_err("absolute link");
        assert!(error.to_string().contains("missing"), "{error}");
        assert!(!root.join("host").exists());
    }

    #[test]
    fn hard_links_devices_and_root_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let stats = apply(
            root,
            &layer(&[
                Item::Dir("./"),
                Item::Dir("bin/"),
                Item::File("bin/a", b"same"),
                Item::HardLink("bin/b", "bin/a"),
                Item::CharDevice("dev-null"),
            ]),
        )
        .expect("layer");
        assert_eq!(stats.devices_skipped, 1);
        assert!(!root.join("dev-null").exists());
        let (a, b) = (fs::metadata(root.join("bin/a")).expect("a"), fs::metadata(root.join("bin/b")).expect("b"));
        assert_eq!(a.ino(), b.ino());
        assert!(disk_usage(root).expect("du") > 0);
    }

    #[test]
    fn zstd_layers_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = zstd::stream::encode_all(&layer(&[Item::File("z", b"zstd")])[..], 1).expect("zstd");
        apply(dir.path(), &bytes).expect("zstd layer");
        assert_eq!(fs::read(dir.path().join("z")).expect("z"), b"zstd");
    }
}

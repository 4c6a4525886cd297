//! The node's container image store: images pulled from a registry or read from a file on the node, unpacked once,
//! and cached by manifest digest for every later task that names the same content.
//!
//! # Layout (under the store's root, `0700`, root's)
//!
//! ```text
//! sha256-<hex>/            one complete image, named by its digest
//!     rootfs/              the unpacked tree (the rest of the system mounts overlayfs with it as a lower dir)
//!     config.json          the image's config blob (`{}` for a squashfs file)
//!     size                 bytes the entry takes on disk, decimal
//!     last-used            its mtime is the last use (LRU); its text the reference last used with
//!     complete             marker, written last
//! locks/sha256-<hex>.lock  the entry's flock(2) file
//! tmp/import-sha256-<hex>-<pid>-<n>/   an import in progress (becomes the entry by rename(2))
//! tmp/trash-sha256-<hex>-<pid>-<n>/    an entry being deleted
//! memo/<dev>-<ino>-<size>-<mtime>-<ctime>   a squashfs file's sha256, so a 5 GB file is not hashed on every run
//! ```
//!
//! Digests: a registry image's entry is named by its (platform) image manifest's digest; an OCI archive's by the same
//! manifest digest (so the two share an entry); a docker archive's by its config blob's sha256 (docker's image id; every
//! layer is checked against the config's `diff_ids`); a squashfs file's by the sha256 of its bytes.
//!
//! # Concurrency
//!
//! Several supervisors (one per task, separate processes) may acquire the same image at once. Everything about one
//! digest is decided under `flock` on its lock file:
//! - a user of an entry ([`CachedImage`]) holds a *shared* lock for as long as it lives;
//! - an importer takes the *exclusive* lock, checks again whether the entry appeared while it waited, imports into
//!   `tmp/`, renames into place (so an entry that exists is complete), then turns its lock into a shared one; the
//!   others were waiting for the lock and find the entry done;
//! - eviction takes the exclusive lock without waiting and skips the entry when it cannot, and also skips an entry
//!   whose `rootfs` is a lower dir of a live overlay mount (`lowerdir=` in `/proc/self/mountinfo`), since a container
//!   may outlive the [`CachedImage`] that started it.
//!
//! Lock files are removed by eviction with the exclusive lock held; a waiter that then gets a lock on the removed file
//! notices (the path no longer names its file) and opens the new one.
//!
//! # Eviction
//!
//! After every import, and on [`ImageStore::evict`]: least recently used entries first, until the total is at most the
//! limit, skipping those in use. Leftovers of crashed imports or deletions in `tmp/` are removed when no one holds
//! their digest's lock. A full disk (ENOSPC) during an import removes the partial import and reports
//! [`ImageError::CacheFull`].
//!
//! Registry images are always resolved against the registry with the job's user's credentials, even when cached: that
//! is the check that the user may read the image, and it notices a moved tag.

mod archive;
mod credentials;
mod error;
mod registry;
mod unpack;

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use drover_state::container::{ImageRef, RegistryImage};

pub use credentials::RegistryCredentials;
pub use error::ImageError;

use error::is_no_space;
use unpack::UnpackError;

/// Largest manifest, index or config document accepted.
pub(crate) const MAX_JSON_BYTES: u64 = 4 * 1024 * 1024;
/// Most layers in one image (docker's own limit is 127; some builders go further).
pub(crate) const MAX_LAYERS: usize = 1000;
/// Most squashfs digests remembered; the oldest go first.
const MAX_MEMO_ENTRIES: usize = 1024;
/// Tries at getting a shared lock on a complete entry (each lost only to an eviction in between).
const MAX_ACQUIRE_ATTEMPTS: usize = 8;
/// Longest unsquashfs message kept for an error.
const MAX_TOOL_MESSAGE_BYTES: u64 = 2048;

/// `bytes` as lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// How the store behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Eviction brings the cache's total down to this.
    pub limit_bytes: u64,
    /// Registries (`host[:port]`) spoken to over plain http; loopback hosts (127.0.0.1, localhost, [::1]) always may.
    pub insecure_registries: Vec<String>,
    /// Layers downloaded at once.
    pub parallel_layers: usize,
    /// Connecting, and waiting for any answer or any data, gives up after this long.
    pub timeout_ms: u64,
    /// Longest wait for another process's import of the same image.
    pub lock_wait_ms: u64,
    /// Longest a squashfs file's unpacking may take.
    pub import_timeout_ms: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            limit_bytes: 100 * 1024 * 1024 * 1024,
            insecure_registries: Vec::new(),
            parallel_layers: 4,
            timeout_ms: 30_000,
            lock_wait_ms: 60 * 60 * 1000,
            import_timeout_ms: 60 * 60 * 1000,
        }
    }
}

/// Where an image comes from.
#[derive(Debug)]
pub enum ImageSource {
    Registry(RegistryImage),
    /// A file on the node, already opened *as the job's user* by the caller, so the user's permissions decide
    /// whether it can be read; `path` is what the user named, for messages.
    File {
        file: File,
        path: String,
    },
}

impl ImageSource {
    /// The reference as the user would write it.
    pub fn describe(&self) -> String {
        match self {
            ImageSource::Registry(r) => ImageRef::Registry(r.clone()).to_string(),
            ImageSource::File { path, .. } => path.clone(),
        }
    }
}

/// What the image says about how to run it (`config` of the OCI/docker image config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `K=V`.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

impl ImageConfig {
    /// From the config blob; fields absent or null are empty (a squashfs file has no config at all).
    pub fn parse(bytes: &[u8]) -> Result<ImageConfig, serde_json::Error> {
        #[derive(Deserialize, Default)]
        struct Inner {
            #[serde(rename = "Env")]
            env: Option<Vec<String>>,
            #[serde(rename = "WorkingDir")]
            working_dir: Option<String>,
            #[serde(rename = "Entrypoint")]
            entrypoint: Option<Vec<String>>,
            #[serde(rename = "Cmd")]
            cmd: Option<Vec<String>>,
        }
        #[derive(Deserialize, Default)]
        struct Outer {
            config: Option<Inner>,
        }
        let outer: Outer = serde_json::from_slice(bytes)?;
        let inner = outer.config.unwrap_or_default();
        Ok(ImageConfig {
            env: inner.env.unwrap_or_default(),
            working_dir: inner.working_dir.filter(|w| !w.is_empty()),
            entrypoint: inner.entrypoint.unwrap_or_default(),
            cmd: inner.cmd.unwrap_or_default(),
        })
    }
}

/// An image ready to use. While it lives, its entry holds a shared lock and is never evicted.
#[derive(Debug)]
pub struct CachedImage {
    /// `sha256:...`.
    pub digest: String,
    /// The unpacked tree.
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// This call did the import (the others found it cached or waited for it).
    pub imported: bool,
    _lock: File,
}

/// One cached image, as [`ImageStore::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    pub digest: String,
    /// The reference it was last used with.
    pub reference: String,
    pub bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub last_used_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    /// Least recently used first.
    pub images: Vec<StoredImage>,
    pub total_bytes: u64,
    pub limit_bytes: u64,
}

/// The node's image cache. See the module documentation for the layout and the locking rules.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    options: StoreOptions,
}

/// Distinguishes temporary names made by one process.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

fn unique_suffix() -> String {
    format!("{}-{}", std::process::id(), SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

/// Removes a directory on drop unless disarmed: a failed or interrupted import leaves nothing behind.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(e) = fs::remove_dir_all(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a failed import");
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum LockMode {
    Shared,
    Exclusive,
}

fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on a descriptor this `File` owns.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// What waiting for a lock came to.
enum Locked {
    Held(File),
    /// `deadline` passed.
    TimedOut,
    /// The caller's `stop_waiting` said the lock is no longer needed.
    NotNeeded,
}

/// Opens and locks `path`, waiting until `deadline` (polled, since flock(2) has no timeout) or until `stop_waiting`
/// says the lock is no longer needed. Retries when the file was removed by an eviction between opening and locking,
/// so the lock held is always on the file the path names.
fn lock_file(path: &Path, mode: LockMode, deadline: Instant, stop_waiting: &dyn Fn() -> bool) -> io::Result<Locked> {
    let operation = match mode {
        LockMode::Shared => libc::LOCK_SH,
        LockMode::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    let mut pause = Duration::from_millis(5);
    loop {
        let file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        loop {
            match flock(&file, operation) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) || e.kind() == io::ErrorKind::Interrupted => {
                    if stop_waiting() {
                        return Ok(Locked::NotNeeded);
                    }
                    if Instant::now() >= deadline {
                        return Ok(Locked::TimedOut);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
        let held = file.metadata()?;
        match fs::metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(Locked::Held(file)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
}

/// Takes the lock without waiting: `None` when someone holds it.
fn try_lock(path: &Path) -> io::Result<Option<File>> {
    match lock_file(path, LockMode::Exclusive, Instant::now(), &|| false)? {
        Locked::Held(file) => Ok(Some(file)),
        Locked::TimedOut | Locked::NotNeeded => Ok(None),
    }
}

/// `overlay` mounts' super options in this mount namespace (`/proc/self/mountinfo`).
fn overlay_options() -> Vec<String> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let (_, after) = line.split_once(" - ")?;
            let mut fields = after.split(' ');
            let fstype = fields.next()?;
            let _source = fields.next()?;
            let options = fields.next()?;
            (fstype == "overlay").then(|| unescape_mountinfo(options))
        })
        .collect()
}

/// Whether some mount's root lies inside the entry named `name` (`sha256-HEX`, unique on the node): containers
/// of non-root users mount an idmapped clone of the image's tree, which an overlay then names by the clone's path.
fn mounted_elsewhere(name: &str) -> bool {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else { return false };
    let inside = format!("/{name}/");
    text.lines().filter_map(|line| line.split(' ').nth(3)).any(|root| {
        let root = unescape_mountinfo(root);
        root.contains(&inside) || root.ends_with(&format!("/{name}"))
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether an overlay's options name `entry` (or a path below it) in `lowerdir=`.
fn is_lower_dir(options: &str, entry: &Path) -> bool {
    let entry = entry.to_string_lossy();
    options.split(',').filter_map(|o| o.strip_prefix("lowerdir=").or_else(|| o.strip_prefix("lowerdir+="))).any(
        |dirs| {
            // Lower dirs are joined by `:` (a literal colon is `\:`), data-only ones by `::`.
            dirs.split(':').any(|dir| {
                let dir = dir.trim_end_matches('\\');
                dir == entry || dir.strip_prefix(entry.as_ref()).is_some_and(|rest| rest.starts_with('/'))
            })
        },
    )
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads at most `limit` bytes of a small bookkeeping file.
fn read_small(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

impl ImageStore {
    /// Opens (creating it, `0700`) the store at `root`, and clears what crashed imports left.
    pub fn open(root: &Path, options: StoreOptions) -> Result<ImageStore, ImageError> {
        let store_error = |path: &Path, context: &str, source| ImageError::Store {
            path: path.to_path_buf(),
            context: context.to_string(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| store_error(root, "cannot create the image cache", e))?;
        let meta = fs::symlink_metadata(root).map_err(|e| store_error(root, "cannot open the image cache", e))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        // Tasks' root file systems live here: a directory someone else owns (or a link to one) could be swapped under
        // the agent.
        if !meta.is_dir() || meta.uid() != euid {
            return Err(store_error(
                root,
                "the image cache must be a directory owned by the agent's user",
                io::Error::from(io::ErrorKind::PermissionDenied),
            ));
        }
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .map_err(|e| store_error(root, "cannot restrict the image cache to root", e))?;
        for sub in ["locks", "tmp", "memo"] {
            let path = root.join(sub);
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
                .map_err(|e| store_error(&path, "cannot create", e))?;
        }
        let store = ImageStore { root: root.to_path_buf(), options };
        store.clean_tmp();
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn entry_path(&self, digest: &str) -> PathBuf {
        self.root.join(digest.replacen(':', "-", 1))
    }

    fn lock_path(&self, digest: &str) -> PathBuf {
        self.root.join("locks").join(format!("{}.lock", digest.replacen(':', "-", 1)))
    }

    /// Resolves the image to a digest (asking the registry every time, with `credentials`), imports it unless cached,
    /// marks it used and returns it. Blocks while another process imports the same image, then uses its result.
    pub fn acquire(&self, image: &ImageSource, credentials: &RegistryCredentials) -> Result<CachedImage, ImageError> {
        match image {
            ImageSource::Registry(reference) => {
                let client = registry::RegistryClient::new(
                    reference,
                    credentials,
                    &self.options.insecure_registries,
                    self.options.timeout_ms,
                    &self.root,
                );
                let resolved = client.resolve(&reference.reference)?;
                tracing::debug!(image = client.image(), digest = %resolved.digest, "resolved image");
                self.get_or_import(&resolved.digest, client.image(), &|tmp| {
                    self.import_registry(&client, &resolved, tmp)
                })
            }
            ImageSource::File { file, path } => match archive::sniff(path, file)? {
                archive::FileFormat::Squashfs => {
                    let digest = self.squashfs_digest(path, file)?;
                    self.get_or_import(&digest, path, &|tmp| self.import_squashfs(path, file, &digest, tmp))
                }
                archive::FileFormat::Tar => {
                    let archive = archive::Archive::open(path, file)?;
                    let plan = archive::plan(&archive)?;
                    tracing::debug!(image = %path, kind = plan.kind, digest = %plan.digest, "read image archive");
                    self.get_or_import(&plan.digest, path, &|tmp| self.import_archive(path, &archive, &plan, tmp))
                }
            },
        }
    }

    /// The locking dance of the module documentation around `import`, which fills a temporary entry directory.
    fn get_or_import(
        &self,
        digest: &str,
        reference: &str,
        import: &dyn Fn(&Path) -> Result<(), ImageError>,
    ) -> Result<CachedImage, ImageError> {
        let entry = self.entry_path(digest);
        let lock_path = self.lock_path(digest);
        let deadline = Instant::now() + Duration::from_millis(self.options.lock_wait_ms);
        let complete = || entry.join("complete").exists();
        let lock = |mode, stop_waiting: &dyn Fn() -> bool| match lock_file(&lock_path, mode, deadline, stop_waiting)
            .map_err(|e| ImageError::store(&self.root, reference, &lock_path, "cannot lock", e))?
        {
            Locked::Held(file) => Ok(Some(file)),
            Locked::NotNeeded => Ok(None),
            Locked::TimedOut => Err(ImageError::LockTimeout {
                image: reference.to_string(),
                lock: lock_path.clone(),
                waited_ms: self.options.lock_wait_ms,
            }),
        };
        let mut imported = false;
        for _ in 0..MAX_ACQUIRE_ATTEMPTS {
            let Some(shared) = lock(LockMode::Shared, &|| false)? else { continue };
            if complete() {
                return self.use_entry(digest, &entry, reference, shared, imported);
            }
            drop(shared);
            // Two acquirers can both find the entry missing under their shared locks. The one that wins the
            // exclusive lock imports and keeps a shared lock for as long as it uses the image, so the other would
            // wait for the exclusive lock forever: it stops waiting once the entry is complete and takes a shared
            // lock instead.
            let Some(exclusive) = lock(LockMode::Exclusive, &complete)? else { continue };
            if !complete() {
                self.import_entry(digest, &entry, reference, import)?;
                imported = true;
            }
            // Linux converts an exclusive flock to a shared one without a gap, but the entry is checked again
            // rather than relying on it.
            flock(&exclusive, libc::LOCK_SH)
                .map_err(|e| ImageError::store(&self.root, reference, &lock_path, "cannot lock", e))?;
            if entry.join("complete").exists() {
                let image = self.use_entry(digest, &entry, reference, exclusive, imported)?;
                if imported && let Err(e) = self.evict() {
                    tracing::warn!(error = %e, "image cache eviction failed");
                }
                return Ok(image);
            }
        }
        Err(ImageError::Store {
            path: entry,
            context: format!("image {reference} was evicted {MAX_ACQUIRE_ATTEMPTS} times while being acquired"),
            source: io::Error::from(io::ErrorKind::Interrupted),
        })
    }

    /// Marks the entry used and hands it out with `lock` (shared) held.
    fn use_entry(
        &self,
        digest: &str,
        entry: &Path,
        reference: &str,
        lock: File,
        imported: bool,
    ) -> Result<CachedImage, ImageError> {
        self.touch(entry, reference);
        let config_path = entry.join("config.json");
        let bytes = read_small(&config_path, MAX_JSON_BYTES)
            .map_err(|e| ImageError::store(&self.root, reference, &config_path, "cannot read the image config", e))?;
        let config = ImageConfig::parse(&bytes).map_err(|e| ImageError::BadManifest {
            image: reference.to_string(),
            what: "image config".into(),
            why: e.to_string(),
        })?;
        Ok(CachedImage { digest: digest.to_string(), rootfs: entry.join("rootfs"), config, imported, _lock: lock })
    }

    /// Rewrites `last-used` (a new file: its mtime is now) with the reference; failure only weakens the LRU order.
    fn touch(&self, entry: &Path, reference: &str) {
        let tmp = entry.join(format!(".last-used-{}", unique_suffix()));
        let result = fs::write(&tmp, reference.as_bytes()).and_then(|()| fs::rename(&tmp, entry.join("last-used")));
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            tracing::warn!(entry = %entry.display(), error = %e, "cannot mark an image used");
        }
    }

    /// Imports into `tmp/`, then renames into place. Called with the exclusive lock held.
    fn import_entry(
        &self,
        digest: &str,
        entry: &Path,
        reference: &str,
        import: &dyn Fn(&Path) -> Result<(), ImageError>,
    ) -> Result<(), ImageError> {
        let started = Instant::now();
        let name = digest.replacen(':', "-", 1);
        let tmp_path = self.root.join("tmp").join(format!("import-{name}-{}", unique_suffix()));
        let store_error = |path: &Path, context: &str, e| ImageError::store(&self.root, reference, path, context, e);
        fs::DirBuilder::new().mode(0o700).create(&tmp_path).map_err(|e| store_error(&tmp_path, "cannot create", e))?;
        let mut tmp = TempDir(Some(tmp_path.clone()));
        import(&tmp_path)?;
        let blobs = tmp_path.join("blobs");
        if blobs.exists() {
            fs::remove_dir_all(&blobs).map_err(|e| store_error(&blobs, "cannot remove", e))?;
        }
        let rootfs = tmp_path.join("rootfs");
        let bytes = unpack::disk_usage(&tmp_path).map_err(|e| store_error(&rootfs, "cannot measure", e))?;
        for (file, contents) in
            [("size", bytes.to_string()), ("last-used", reference.to_string()), ("complete", String::new())]
        {
            let path = tmp_path.join(file);
            fs::write(&path, contents).map_err(|e| store_error(&path, "cannot write", e))?;
        }
        // The entry must be whole on disk before its name says it is complete.
        let dir = File::open(&tmp_path).map_err(|e| store_error(&tmp_path, "cannot open", e))?;
        // SAFETY: syncfs on a descriptor this `File` owns.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(store_error(&tmp_path, "cannot flush", io::Error::last_os_error()));
        }
        if fs::symlink_metadata(entry).is_ok() {
            // Left by something other than a rename of a complete import; nobody uses it (no `complete`).
            self.remove_entry_dir(entry, &name).map_err(|e| store_error(entry, "cannot remove a stale entry", e))?;
        }
        fs::rename(&tmp_path, entry).map_err(|e| store_error(entry, "cannot move the import into place", e))?;
        tmp.0 = None;
        tracing::info!(image = %reference, digest = %digest, bytes, elapsed_ms = started.elapsed().as_millis() as u64, "imported image");
        Ok(())
    }

    /// Maps an unpacking failure: the user's layer is at fault, or the disk.
    fn unpack_error(&self, reference: &str, layer: usize, error: UnpackError) -> ImageError {
        match error {
            UnpackError::Bad(why) => {
                ImageError::BadArchive { image: reference.to_string(), why: format!("layer {layer}: {why}") }
            }
            UnpackError::Digest { expected, actual } => ImageError::DigestMismatch {
                image: reference.to_string(),
                what: format!("layer {layer}"),
                expected,
                actual,
            },
            UnpackError::Io { context, source } if is_no_space(&source) => {
                tracing::debug!(%context, "no space while unpacking");
                ImageError::CacheFull { cache: self.root.clone(), image: reference.to_string() }
            }
            UnpackError::Io { context, source }
                if matches!(
                    source.kind(),
                    io::ErrorKind::InvalidData
                        | io::ErrorKind::InvalidInput
                        | io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::Other
                ) =>
            {
                ImageError::BadArchive {
                    image: reference.to_string(),
                    why: format!("layer {layer}: {context}: {source}"),
                }
            }
            UnpackError::Io { context, source } => ImageError::Store { path: self.root.clone(), context, source },
        }
    }

    fn make_rootfs(&self, reference: &str, tmp: &Path) -> Result<PathBuf, ImageError> {
        let rootfs = tmp.join("rootfs");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&rootfs)
            .map_err(|e| ImageError::store(&self.root, reference, &rootfs, "cannot create", e))?;
        Ok(rootfs)
    }

    fn write_config(&self, reference: &str, tmp: &Path, config: &[u8]) -> Result<(), ImageError> {
        ImageConfig::parse(config).map_err(|e| ImageError::BadManifest {
            image: reference.to_string(),
            what: "image config".into(),
            why: e.to_string(),
        })?;
        let path = tmp.join("config.json");
        fs::write(&path, config).map_err(|e| ImageError::store(&self.root, reference, &path, "cannot write", e))
    }

    fn import_registry(
        &self,
        client: &registry::RegistryClient,
        resolved: &registry::Resolved,
        tmp: &Path,
    ) -> Result<(), ImageError> {
        let reference = client.image();
        let config = client.config(&resolved.manifest.config)?;
        self.write_config(reference, tmp, &config)?;
        let blobs = tmp.join("blobs");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&blobs)
            .map_err(|e| ImageError::store(&self.root, reference, &blobs, "cannot create", e))?;
        let layers = &resolved.manifest.layers;
        let files = client.download_layers(layers, &blobs, self.options.parallel_layers)?;
        let rootfs = self.make_rootfs(reference, tmp)?;
        for (i, path) in files.iter().enumerate() {
            // Downloaded into the root-only temporary directory and checked there: nobody can change them now.
            unpack::apply_layer(&rootfs, || File::open(path), None).map_err(|e| self.unpack_error(reference, i, e))?;
            if !files[i + 1..].contains(path) {
                let _ = fs::remove_file(path);
            }
        }
        Ok(())
    }

    fn import_archive(
        &self,
        reference: &str,
        archive: &archive::Archive<'_>,
        plan: &archive::ArchivePlan,
        tmp: &Path,
    ) -> Result<(), ImageError> {
        self.write_config(reference, tmp, &plan.config)?;
        let rootfs = self.make_rootfs(reference, tmp)?;
        for (i, (name, check)) in plan.layers.iter().enumerate() {
            let open = || archive.reader(name).map_err(io::Error::other);
            unpack::apply_layer(&rootfs, open, Some(check)).map_err(|e| self.unpack_error(reference, i, e))?;
        }
        Ok(())
    }

    /// The sha256 of a squashfs file, remembered per (device, inode, size, mtime, ctime): the ctime cannot be set by
    /// the file's owner, so any change to the file gives a new key.
    fn squashfs_digest(&self, reference: &str, file: &File) -> Result<String, ImageError> {
        let file_error = |source| ImageError::File { image: reference.to_string(), source };
        let meta = file.metadata().map_err(file_error)?;
        let key = format!(
            "{}-{}-{}-{}.{}-{}.{}",
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec()
        );
        let memo = self.root.join("memo").join(&key);
        if let Ok(bytes) = read_small(&memo, 128) {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if registry::check_digest(reference, "memo", &text).is_ok() {
                return Ok(text);
            }
        }
        let mut hasher = Sha256::new();
        io::copy(&mut archive::Region::new(file, 0, meta.size()), &mut HashSink(&mut hasher)).map_err(file_error)?;
        let digest = format!("sha256:{}", hex(&hasher.finalize()));
        let tmp = self.root.join("memo").join(format!(".{key}-{}", unique_suffix()));
        if fs::write(&tmp, &digest).and_then(|()| fs::rename(&tmp, &memo)).is_err() {
            let _ = fs::remove_file(&tmp);
        }
        self.prune_memo();
        Ok(digest)
    }

    fn prune_memo(&self) {
        let Ok(entries) = fs::read_dir(self.root.join("memo")) else { return };
        let mut memos: Vec<(SystemTime, PathBuf)> =
            entries.flatten().filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).collect();
        if memos.len() <= MAX_MEMO_ENTRIES {
            return;
        }
        memos.sort();
        for (_, path) in &memos[..memos.len() - MAX_MEMO_ENTRIES] {
            let _ = fs::remove_file(path);
        }
    }

    /// Unpacks a squashfs file with unsquashfs. The file is first copied into the import directory while it is hashed
    /// again: the entry is named by that hash and shared with every user whose file has the same bytes, so what is
    /// unpacked must be exactly what was hashed, even if the owner rewrites the file meanwhile.
    fn import_squashfs(&self, reference: &str, file: &File, digest: &str, tmp: &Path) -> Result<(), ImageError> {
        let copy_path = tmp.join("blobs");
        let store_error = |path: &Path, context: &str, e| ImageError::store(&self.root, reference, path, context, e);
        let len = file.metadata().map_err(|source| ImageError::File { image: reference.to_string(), source })?.len();
        let mut copy = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&copy_path)
            .map_err(|e| store_error(&copy_path, "cannot create", e))?;
        let mut hasher = Sha256::new();
        let mut source = archive::Region::new(file, 0, len);
        let mut buffer = vec![0u8; 1024 * 1024];
        loop {
            let n = match source.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(ImageError::File { image: reference.to_string(), source }),
            };
            hasher.update(&buffer[..n]);
            copy.write_all(&buffer[..n]).map_err(|e| store_error(&copy_path, "cannot copy the squashfs file", e))?;
        }
        drop(copy);
        let actual = format!("sha256:{}", hex(&hasher.finalize()));
        if actual != digest {
            return Err(ImageError::DigestMismatch {
                image: reference.to_string(),
                what: "squashfs file (it changed while being imported)".into(),
                expected: digest.to_string(),
                actual,
            });
        }
        let rootfs = tmp.join("rootfs");
        let log_path = tmp.join("unsquashfs.log");
        let log = File::create(&log_path).map_err(|e| store_error(&log_path, "cannot create", e))?;
        let log_err = log.try_clone().map_err(|e| store_error(&log_path, "cannot create", e))?;
        let mut child = std::process::Command::new("unsquashfs")
            .args(["-no-xattrs", "-no-progress", "-d"])
            .arg(&rootfs)
            .arg(&copy_path)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| ImageError::Unsquashfs {
                image: reference.to_string(),
                why: format!("cannot run unsquashfs ({e}): install squashfs-tools"),
            })?;
        let deadline = Instant::now() + Duration::from_millis(self.options.import_timeout_ms);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ImageError::Unsquashfs {
                        image: reference.to_string(),
                        why: format!("it ran longer than {} ms", self.options.import_timeout_ms),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(ImageError::Unsquashfs { image: reference.to_string(), why: e.to_string() }),
            }
        };
        let _ = fs::remove_file(&copy_path);
        let message = {
            let len = fs::metadata(&log_path).map_or(0, |m| m.len());
            let mut tail = String::new();
            if let Ok(mut f) = File::open(&log_path) {
                let _ = io::Seek::seek(&mut f, io::SeekFrom::Start(len.saturating_sub(MAX_TOOL_MESSAGE_BYTES)));
                let _ = f.take(MAX_TOOL_MESSAGE_BYTES).read_to_string(&mut tail);
            }
            let _ = fs::remove_file(&log_path);
            tail.trim().to_string()
        };
        if !status.success() {
            if message.contains("No space left on device") || message.contains("Disk quota exceeded") {
                return Err(ImageError::CacheFull { cache: self.root.clone(), image: reference.to_string() });
            }
            return Err(ImageError::Unsquashfs { image: reference.to_string(), why: format!("{status}: {message}") });
        }
        let removed = unpack::remove_device_nodes(&rootfs).map_err(|e| store_error(&rootfs, "cannot clean", e))?;
        if removed > 0 {
            tracing::info!(image = %reference, count = removed, "removed device nodes from a squashfs image");
        }
        self.write_config(reference, tmp, b"{}")
    }

    /// Cached images, least recently used first, with the total and the limit.
    pub fn status(&self) -> StoreStatus {
        let images = self.entries();
        let total_bytes = images.iter().map(|i| i.bytes).fold(0u64, u64::saturating_add);
        StoreStatus { images, total_bytes, limit_bytes: self.options.limit_bytes }
    }

    fn entries(&self) -> Vec<StoredImage> {
        let Ok(dir) = fs::read_dir(&self.root) else { return Vec::new() };
        let mut images: Vec<StoredImage> = dir
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let hex = name.strip_prefix("sha256-")?;
                let path = e.path();
                if !path.join("complete").exists() {
                    return None;
                }
                let bytes = read_small(&path.join("size"), 32)
                    .ok()
                    .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
                    .unwrap_or(0);
                let last_used = fs::symlink_metadata(path.join("last-used")).and_then(|m| m.modified()).ok();
                let reference = read_small(&path.join("last-used"), 8192)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                Some(StoredImage {
                    digest: format!("sha256:{hex}"),
                    reference,
                    bytes,
                    last_used_ms: last_used.map_or(0, millis),
                })
            })
            .collect();
        images.sort_by(|a, b| a.last_used_ms.cmp(&b.last_used_ms).then_with(|| a.digest.cmp(&b.digest)));
        images
    }

    /// Removes least recently used images until the total is at most the limit, skipping images in use (a live
    /// [`CachedImage`] or an overlay mount). Returns the bytes freed.
    pub fn evict(&self) -> Result<u64, ImageError> {
        self.clean_tmp();
        let images = self.entries();
        let mut total = images.iter().map(|i| i.bytes).fold(0u64, u64::saturating_add);
        let mut freed = 0u64;
        if total <= self.options.limit_bytes {
            return Ok(0);
        }
        let overlays = overlay_options();
        for image in images {
            if total <= self.options.limit_bytes {
                break;
            }
            let entry = self.entry_path(&image.digest);
            let lock_path = self.lock_path(&image.digest);
            let store_error = |path: &Path, e| ImageError::Store {
                path: path.to_path_buf(),
                context: "cannot evict".to_string(),
                source: e,
            };
            let Some(lock) = try_lock(&lock_path).map_err(|e| store_error(&lock_path, e))? else {
                tracing::debug!(digest = %image.digest, "not evicting an image in use");
                continue;
            };
            let name = image.digest.replacen(':', "-", 1);
            if overlays.iter().any(|o| is_lower_dir(o, &entry)) || mounted_elsewhere(&name) {
                tracing::debug!(digest = %image.digest, "not evicting an image under an overlay mount");
                continue;
            }
            self.remove_entry_dir(&entry, &name).map_err(|e| store_error(&entry, e))?;
            // Removed while held: a waiter on this file sees that its path now names nothing and starts over.
            let _ = fs::remove_file(&lock_path);
            drop(lock);
            total = total.saturating_sub(image.bytes);
            freed = freed.saturating_add(image.bytes);
            tracing::info!(digest = %image.digest, reference = %image.reference, bytes = image.bytes, "evicted image");
        }
        if total > self.options.limit_bytes {
            tracing::warn!(total, limit = self.options.limit_bytes, "image cache over its limit: the rest is in use");
        }
        Ok(freed)
    }

    /// Moves an entry out of its name first (so it stops existing at once), then deletes it.
    fn remove_entry_dir(&self, entry: &Path, name: &str) -> io::Result<()> {
        let trash = self.root.join("tmp").join(format!("trash-{name}-{}", unique_suffix()));
        fs::rename(entry, &trash)?;
        match fs::remove_dir_all(&trash) {
            // Another process's clean-up got to it first.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Removes `tmp/` leftovers whose digest no one holds the exclusive lock of (a crashed import or eviction).
    fn clean_tmp(&self) {
        let Ok(dir) = fs::read_dir(self.root.join("tmp")) else { return };
        for leftover in dir.flatten() {
            let name = leftover.file_name().to_string_lossy().into_owned();
            let digest = name
                .strip_prefix("import-")
                .or_else(|| name.strip_prefix("trash-"))
                .and_then(|rest| rest.get(..7 + 64))
                .filter(|d| d.starts_with("sha256-"));
            let Some(digest) = digest else { continue };
            let lock_path = self.root.join("locks").join(format!("{digest}.lock"));
            // An import or a deletion in progress holds the digest's exclusive lock (and a lock file exists while it
            // does: only a holder of the exclusive lock removes it).
            let busy = lock_path.exists() && !matches!(try_lock(&lock_path), Ok(Some(_)));
            if busy {
                continue;
            }
            if let Err(e) = fs::remove_dir_all(leftover.path()) {
                tracing::warn!(path = %leftover.path().display(), error = %e, "cannot remove an import leftover");
            }
        }
    }
}

/// An `io::Write` that only hashes.
struct HashSink<'a>(&'a mut Sha256);

impl Write for HashSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! Store-level tests that need no registry: archives built here, eviction order, and concurrent acquires.

use std::fs;
use std::io::Write;
use std::path::Path;

use sha2::{Digest as _, Sha256};

use super::unpack::tests::{Item, layer};
use super::*;

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *data).expect("append");
    }
    builder.into_inner().expect("tar")
}

/// An OCI archive of an image with one layer holding `marker` with `content`; returns (bytes, manifest digest).
pub(super) fn oci_archive(marker: &str, content: &[u8]) -> (Vec<u8>, String) {
    let layer_bytes = gzip(&layer(&[Item::Dir("data/"), Item::File(&format!("data/{marker}"), content)]));
    let config = br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/data","Cmd":["sh"]},
        "rootfs":{"type":"layers","diff_ids":[]}}"#;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},
        "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}}]}}"#,
        registry::OCI_MANIFEST,
        sha(config),
        config.len(),
        sha(&layer_bytes),
        layer_bytes.len()
    );
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{}","digest":"{}","size":{}}}]}}"#,
        registry::OCI_MANIFEST,
        sha(manifest.as_bytes()),
        manifest.len()
    );
    let blob = |b: &[u8]| format!("blobs/sha256/{}", &sha(b)[7..]);
    let bytes = tar_of(&[
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#),
        ("index.json", index.as_bytes()),
        (&blob(manifest.as_bytes()), manifest.as_bytes()),
        (&blob(config), config),
        (&blob(&layer_bytes), &layer_bytes),
    ]);
    (bytes, sha(manifest.as_bytes()))
}

fn source(path: &Path) -> ImageSource {
    ImageSource::File { file: File::open(path).expect("open"), path: path.display().to_string() }
}

fn store(root: &Path, limit_bytes: u64) -> ImageStore {
    // A lock wait far below the production hour: a locking bug fails here in a minute instead of holding CI.
    ImageStore::open(root, StoreOptions { limit_bytes, lock_wait_ms: 60_000, ..StoreOptions::default() })
        .expect("open store")
}

#[test]
fn oci_archive_is_imported_once_then_reused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, digest) = oci_archive("hello", b"world");
    let path = dir.path().join("image.whatever");
    fs::write(&path, bytes).expect("write");
    let store = store(&dir.path().join("cache"), u64::MAX);
    let first = store.acquire(&source(&path), &RegistryCredentials::none()).expect("acquire");
    assert!(first.imported);
    assert_eq!(first.digest, digest);
    assert_eq!(fs::read(first.rootfs.join("data/hello")).expect("file"), b"world");
    assert_eq!(first.config.env, vec!["A=1".to_string()]);
    assert_eq!(first.config.working_dir.as_deref(), Some("/data"));
    assert_eq!(first.config.cmd, vec!["sh".to_string()]);
    let second = store.acquire(&source(&path), &RegistryCredentials::none()).expect("again");
    assert!(!second.imported);
    let mode = fs::metadata(store.root()).expect("root").mode() & 0o777;
    assert_eq!(mode, 0o700);
    let status = store.status();
    assert_eq!(status.images.len(), 1);
    assert_eq!(status.images[0].reference, path.display().to_string());
    assert!(status.total_bytes > 0);
}

#[test]
fn a_tampered_archive_layer_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut bytes, _) = oci_archive("hello", b"world");
    // Flip a byte inside the layer blob (the only gzip stream); the manifest and config still check.
    let at = bytes.windows(3).position(|w| w == [0x1f, 0x8b, 0x08]).expect("layer") + 20;
    bytes[at] ^= 0xff;
    let path = dir.path().join("image.tar");
    fs::write(&path, bytes).expect("write");
    let store = store(&dir.path().join("cache"), u64::MAX);
    let error = store.acquire(&source(&path), &RegistryCredentials::none()).expect_err("tampered");
    let text = error.to_string();
    assert!(text.contains("does not match its digest") || text.contains("bad archive"), "{text}");
    assert!(store.status().images.is_empty());
    assert_eq!(fs::read_dir(store.root().join("tmp")).expect("tmp").count(), 0);
}

#[test]
fn eviction_is_lru_and_skips_images_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    let importer = store(&root, u64::MAX);
    let mut held = Vec::new();
    let mut digests = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let (bytes, digest) = oci_archive(name, &vec![b'x'; 20_000 * (i + 1)]);
        let path = dir.path().join(name);
        fs::write(&path, bytes).expect("write");
        held.push(importer.acquire(&source(&path), &RegistryCredentials::none()).expect("acquire"));
        digests.push(digest);
    }
    // a is the oldest, then b, then c.
    for (i, digest) in digests.iter().enumerate() {
        let last_used = importer.entry_path(digest).join("last-used");
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64 * 1000);
        File::options().write(true).open(&last_used).expect("open").set_modified(when).expect("mtime");
    }
    let [a, b, c] =
        [0, 1, 2].map(|i| importer.status().images.iter().find(|s| s.digest == digests[i]).expect("img").bytes);
    let mut held_a = held.remove(0);
    drop(held);
    // Only a (oldest, in use) and c fit: b goes, c stays, a is skipped.
    let limited = store(&root, a + c);
    assert_eq!(limited.evict().expect("evict"), b);
    let left: Vec<String> = limited.status().images.into_iter().map(|s| s.digest).collect();
    assert_eq!(left, vec![digests[0].clone(), digests[2].clone()]);
    assert!(held_a.rootfs.join("data/a").exists());
    // Nothing in use any more and a limit of 0: everything goes, lock files too.
    held_a.imported = false;
    drop(held_a);
    let empty = store(&root, 0);
    assert_eq!(empty.evict().expect("evict"), a + c);
    assert!(empty.status().images.is_empty());
    assert_eq!(fs::read_dir(root.join("locks")).expect("locks").count(), 0);
}

#[test]
fn an_image_whose_tree_is_mounted_elsewhere_is_not_evicted() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED: mounting needs root");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    let importer = store(&root, u64::MAX);
    let (bytes, digest) = oci_archive("m", &vec![b'x'; 20_000]);
    let path = dir.path().join("m");
    fs::write(&path, bytes).expect("write");
    let image = importer.acquire(&source(&path), &RegistryCredentials::none()).expect("acquire");
    let rootfs = image.rootfs.clone();
    drop(image);
    // A container's idmapped clone of the image: a mount whose root is the image's tree, named by another path.
    let clone = dir.path().join("container-lower");
    fs::create_dir(&clone).expect("mkdir");
    let (from, to) = (
        std::ffi::CString::new(rootfs.display().to_string()).expect("path"),
        std::ffi::CString::new(clone.display().to_string()).expect("path"),
    );
    // SAFETY: valid C strings.
    let rc = unsafe { libc::mount(from.as_ptr(), to.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let evicted = store(&root, 0).evict();
    // SAFETY: as above.
    unsafe { libc::umount2(to.as_ptr(), libc::MNT_DETACH) };
    assert_eq!(evicted.expect("evict"), 0, "an image under a container is never evicted");
    assert!(rootfs.join("data/m").exists());
    assert!(importer.status().images.iter().any(|i| i.digest == digest));
    assert!(store(&root, 0).evict().expect("evict") > 0, "once unmounted it may go");
}

#[test]
fn an_overlay_lower_dir_is_recognized() {
    let entry = Path::new("/var/lib/drover/images/sha256-ab");
    assert!(is_lower_dir("rw,lowerdir=/var/lib/drover/images/sha256-ab/rootfs,upperdir=/u,workdir=/w", entry));
    assert!(is_lower_dir("rw,lowerdir=/x:/var/lib/drover/images/sha256-ab/rootfs,upperdir=/u", entry));
    assert!(!is_lower_dir("rw,lowerdir=/var/lib/drover/images/sha256-abc/rootfs,upperdir=/u", entry));
    assert!(!is_lower_dir("rw,upperdir=/var/lib/drover/images/sha256-ab/rootfs", entry));
    assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
}

#[test]
fn two_threads_acquiring_a_new_image_import_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, digest) = oci_archive("big", &vec![7u8; 3_000_000]);
    let path = dir.path().join("image.tar");
    fs::write(&path, bytes).expect("write");
    let root = dir.path().join("cache");
    let results: Vec<CachedImage> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (path, root) = (&path, &root);
                // Separate stores, as separate supervisor processes would have.
                scope.spawn(move || store(root, u64::MAX).acquire(&source(path), &RegistryCredentials::none()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread").expect("acquire")).collect()
    });
    assert_eq!(results.iter().filter(|r| r.imported).count(), 1);
    assert!(results.iter().all(|r| r.digest == digest && r.rootfs.join("data/big").exists()));
}

#[test]
fn crashed_imports_are_cleaned_when_the_store_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    drop(store(&root, u64::MAX));
    let leftover = root.join("tmp").join(format!("import-sha256-{}-1-2", "a".repeat(64)));
    fs::create_dir_all(leftover.join("rootfs")).expect("mkdir");
    drop(store(&root, u64::MAX));
    assert!(!leftover.exists());
}

#[test]
fn image_config_fields_may_be_missing_or_null() {
    assert_eq!(ImageConfig::parse(b"{}").expect("empty"), ImageConfig::default());
    let config =
        ImageConfig::parse(br#"{"config":{"Env":null,"Entrypoint":["/init"],"WorkingDir":""}}"#).expect("null");
    assert_eq!(config.entrypoint, vec!["/init".to_string()]);
    assert!(config.env.is_empty() && config.working_dir.is_none());
}

/// CI hung here for an hour: two acquirers both found the entry missing, one imported and kept its shared lock while
/// using the image, and the other waited for the exclusive lock behind it until `lock_wait_ms`. The interleaving is
/// forced here: the test holds a shared lock (the importer's, still in use), so the acquirer finds the entry
/// missing and waits for the exclusive lock; the entry then appears, and the acquirer must use it at once.
#[test]
fn an_acquirer_waiting_to_import_uses_the_image_another_finished_importing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, digest) = oci_archive("late", b"finished by another");
    let path = dir.path().join("image.tar");
    fs::write(&path, bytes).expect("write");
    let root = dir.path().join("cache");
    let first = store(&root, u64::MAX);
    let entry = first.entry_path(&digest);
    drop(first.acquire(&source(&path), &RegistryCredentials::none()).expect("first import"));
    let aside = dir.path().join("aside");
    fs::rename(&entry, &aside).expect("hide the entry");
    let in_use = File::open(first.lock_path(&digest)).expect("lock file");
    flock(&in_use, libc::LOCK_SH).expect("shared lock");
    let options = StoreOptions { limit_bytes: u64::MAX, lock_wait_ms: 20_000, ..StoreOptions::default() };
    let waiter = ImageStore::open(&root, options).expect("store");
    let image = std::thread::scope(|scope| {
        let handle = scope.spawn(|| waiter.acquire(&source(&path), &RegistryCredentials::none()));
        std::thread::sleep(Duration::from_millis(300));
        fs::rename(&aside, &entry).expect("the other import completes");
        handle.join().expect("thread")
    })
    .expect("acquire while another holds the image");
    assert!(!image.imported, "the waiter used the other's import");
    assert!(image.rootfs.join("data/late").exists());
    drop(in_use);
}

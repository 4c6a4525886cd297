//! The image store against real tools: a `docker-registry` (the Debian package) started per test, images built here
//! and pushed with `skopeo`, a squashfs file made with `mksquashfs`. Missing tools fail the test, naming the package
//! to install: CI installs them, and a skipped test would hide a broken store.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_agent::image::{ImageError, ImageSource, ImageStore, RegistryCredentials, StoreOptions};
use drover_state::container::{ImageRef, RegistryImage};
use sha2::{Digest as _, Sha256};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

fn require(tool: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"] {
        let path = Path::new(dir).join(tool);
        if path.exists() {
            return path;
        }
    }
    panic!("`{tool}` is missing: install the Debian package `{package}` (apt-get install {package})");
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A running `docker-registry`, killed on drop.
struct Registry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    login: Option<(String, String)>,
}

impl Registry {
    fn start(login: Option<(&str, &str)>) -> Registry {
        let binary = require("docker-registry", "docker-registry");
        assert_eq!(binary, Path::new(REGISTRY_BIN));
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = login {
            let hash = bcrypt::hash(password, 4).expect("bcrypt");
            let htpasswd = dir.path().join("htpasswd");
            fs::write(&htpasswd, format!("{user}:{hash}\n")).expect("htpasswd");
            config.push_str(&format!("auth:\n  htpasswd:\n    realm: drover-test\n    path: {}\n", htpasswd.display()));
        }
        let config_path = dir.path().join("config.yml");
        fs::write(&config_path, config).expect("config");
        let log = fs::File::create(dir.path().join("registry.log")).expect("log");
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let registry = Registry { child, port, _dir: dir, login: login.map(|(u, p)| (u.to_string(), p.to_string())) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer =
                ureq::get(&format!("http://127.0.0.1:{port}/v2/")).config().http_status_as_error(false).build().call();
            if answer.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "docker-registry did not answer on port {port} within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn image(&self, repository: &str, tag: &str) -> RegistryImage {
        match ImageRef::parse(&format!("{}#{repository}:{tag}", self.host())).expect("parse") {
            ImageRef::Registry(r) => r,
            ImageRef::File(_) => unreachable!("a registry reference"),
        }
    }

    fn push(&self, layout: &Path, repository: &str, tag: &str) {
        let skopeo = require("skopeo", "skopeo");
        let mut command = Command::new(skopeo);
        command.args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some((user, password)) = &self.login {
            command.arg(format!("--dest-creds={user}:{password}"));
        }
        let output = command
            .arg(format!("oci:{}:v1", layout.display()))
            .arg(format!("docker://{}/{repository}:{tag}", self.host()))
            .stdin(Stdio::null())
            .output()
            .expect("run skopeo");
        assert!(output.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// The digest the registry reports for the tag (Docker-Content-Digest).
    fn digest(&self, repository: &str, tag: &str) -> String {
        let mut request = ureq::get(&format!("http://{}/v2/{repository}/manifests/{tag}", self.host())).header(
            "Accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        );
        if let Some((user, password)) = &self.login {
            use base64::Engine;
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            request = request.header("Authorization", format!("Basic {basic}"));
        }
        let response = request.call().expect("manifest");
        response
            .headers()
            .get("docker-content-digest")
            .expect("Docker-Content-Digest")
            .to_str()
            .expect("ascii")
            .to_string()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tar layer of (path, contents); a path ending in `/` is a directory.
fn layer(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut header = tar::Header::new_gnu();
        if path.ends_with('/') {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
        } else {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
        }
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        builder.append_data(&mut header, path, *data).expect("append");
    }
    builder.into_inner().expect("tar")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

/// Writes an OCI image layout with two gzip layers (the second whiting out a file and a directory of the first) and
/// a config; `variant` goes into a file of the second layer, so each variant is a different image. Returns the
/// manifest's digest.
fn write_layout(dir: &Path, variant: &str) -> String {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).expect("mkdir");
    let put = |bytes: &[u8]| {
        let digest = sha(bytes);
        fs::write(blobs.join(&digest[7..]), bytes).expect("blob");
        digest
    };
    let lower = layer(&[
        ("etc/", b""),
        ("etc/hello", b"from layer one"),
        ("etc/remove-me", b"gone soon"),
        ("opt/", b""),
        ("opt/old/", b""),
        ("opt/old/file", b"old"),
    ]);
    let upper = layer(&[("etc/.wh.remove-me", b""), ("opt/.wh.old", b""), ("opt/variant", variant.as_bytes())]);
    let (lower_gz, upper_gz) = (gzip(&lower), gzip(&upper));
    let config = format!(
        r#"{{"architecture":"{}","os":"linux","config":{{"Env":["PATH=/usr/bin","TINY={variant}"],"WorkingDir":"/opt","Cmd":["/bin/sh","-c","true"]}},"rootfs":{{"type":"layers","diff_ids":["{}","{}"]}}}}"#,
        if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" },
        sha(&lower),
        sha(&upper)
    );
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}},{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}}]}}"#,
        put(config.as_bytes()),
        config.len(),
        put(&lower_gz),
        lower_gz.len(),
        put(&upper_gz),
        upper_gz.len()
    );
    let manifest_digest = put(manifest.as_bytes());
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_digest}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"v1"}}}}]}}"#,
        manifest.len()
    );
    fs::write(dir.join("index.json"), index).expect("index");
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
    manifest_digest
}

fn options() -> StoreOptions {
    // A lock wait far below the production hour: a locking bug fails here in a minute instead of holding CI.
    StoreOptions { limit_bytes: u64::MAX, timeout_ms: 5_000, lock_wait_ms: 60_000, ..StoreOptions::default() }
}

fn check_tiny(rootfs: &Path, variant: &str) {
    assert_eq!(fs::read(rootfs.join("etc/hello")).expect("layer one"), b"from layer one");
    assert_eq!(fs::read(rootfs.join("opt/variant")).expect("layer two"), variant.as_bytes());
    assert!(!rootfs.join("etc/remove-me").exists(), "file whiteout not applied");
    assert!(!rootfs.join("opt/old").exists(), "directory whiteout not applied");
    assert!(!rootfs.join("etc/.wh.remove-me").exists());
}

#[test]
fn registry_pull_is_cached_and_notices_a_moved_tag() {
    let registry = Registry::start(None);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("layout-a");
    write_layout(&layout, "a");
    registry.push(&layout, "team/tiny", "v1");
    let store = ImageStore::open(&work.path().join("cache"), options()).expect("store");
    let source = ImageSource::Registry(registry.image("team/tiny", "v1"));
    let none = RegistryCredentials::none();

    let first = store.acquire(&source, &none).expect("first acquire");
    assert!(first.imported);
    assert_eq!(first.digest, registry.digest("team/tiny", "v1"));
    check_tiny(&first.rootfs, "a");
    assert_eq!(first.config.env, vec!["PATH=/usr/bin".to_string(), "TINY=a".to_string()]);
    assert_eq!(first.config.working_dir.as_deref(), Some("/opt"));
    assert_eq!(first.config.cmd, vec!["/bin/sh", "-c", "true"]);
    assert!(first.config.entrypoint.is_empty());

    let started = Instant::now();
    let second = store.acquire(&source, &none).expect("second acquire");
    assert!(!second.imported);
    assert_eq!(second.digest, first.digest);
    assert!(started.elapsed() < Duration::from_secs(2), "a cached acquire took {:?}", started.elapsed());

    // The tag moves to other content: the next acquire must see it.
    let layout_b = work.path().join("layout-b");
    write_layout(&layout_b, "b");
    registry.push(&layout_b, "team/tiny", "v1");
    let moved = store.acquire(&source, &none).expect("moved tag");
    assert!(moved.imported);
    assert_ne!(moved.digest, first.digest);
    assert_eq!(moved.digest, registry.digest("team/tiny", "v1"));
    check_tiny(&moved.rootfs, "b");
    // By digest, the first image is still there and still cached.
    let by_digest = ImageSource::Registry(
        match ImageRef::parse(&format!("{}#team/tiny@{}", registry.host(), first.digest)).expect("parse") {
            ImageRef::Registry(r) => r,
            ImageRef::File(_) => unreachable!(),
        },
    );
    let old = store.acquire(&by_digest, &none).expect("by digest");
    assert!(!old.imported);
    assert_eq!(old.digest, first.digest);
    let status = store.status();
    assert_eq!(status.images.len(), 2);
    assert!(status.images.iter().any(|i| i.reference.contains("@sha256:")));

    let error =
        store.acquire(&ImageSource::Registry(registry.image("team/tiny", "nope")), &none).expect_err("unknown tag");
    assert!(matches!(error, ImageError::NotFound { .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains(&format!("{}#team/tiny:nope", registry.host())) && text.contains("404"), "{text}");
    let error = store.acquire(&ImageSource::Registry(registry.image("team/absent", "v1")), &none).expect_err("no repo");
    assert!(error.to_string().contains("HTTP 404"), "{error}");
}

#[test]
fn an_unreachable_registry_is_named() {
    let port = free_port();
    let work = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(&work.path().join("cache"), options()).expect("store");
    let image = match ImageRef::parse(&format!("127.0.0.1:{port}#team/tiny:v1")).expect("parse") {
        ImageRef::Registry(r) => r,
        ImageRef::File(_) => unreachable!(),
    };
    let error = store.acquire(&ImageSource::Registry(image), &RegistryCredentials::none()).expect_err("nobody there");
    let text = error.to_string();
    assert!(text.contains(&format!("cannot reach registry 127.0.0.1:{port}: connection refused")), "{text}");
}

#[test]
fn a_registry_with_basic_auth_needs_the_users_credentials() {
    let registry = Registry::start(Some(("alice", "s3cret")));
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("layout");
    write_layout(&layout, "private");
    registry.push(&layout, "team/private", "v1");
    let store = ImageStore::open(&work.path().join("cache"), options()).expect("store");
    let source = ImageSource::Registry(registry.image("team/private", "v1"));

    let error = store.acquire(&source, &RegistryCredentials::none()).expect_err("anonymous");
    assert!(matches!(error, ImageError::AccessDenied { status: 401, .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains("refused access (HTTP 401)") && text.contains(".config/enroot/.credentials"), "{text}");

    let home = work.path().join("home");
    fs::create_dir_all(home.join(".config/enroot")).expect("mkdir");
    fs::write(
        home.join(".config/enroot/.credentials"),
        format!("machine {} login alice password wrong\n", registry.host()),
    )
    .expect("credentials");
    let error = store.acquire(&source, &RegistryCredentials::load(&home)).expect_err("wrong password");
    assert!(matches!(error, ImageError::AccessDenied { .. }), "{error}");

    fs::write(
        home.join(".config/enroot/.credentials"),
        format!("machine {} login alice password s3cret\n", registry.host()),
    )
    .expect("credentials");
    let credentials = RegistryCredentials::load(&home);
    let image = store.acquire(&source, &credentials).expect("with credentials");
    assert!(image.imported);
    check_tiny(&image.rootfs, "private");
    drop(image);
    // Cached now, but a user without credentials still may not use it: the registry is asked every time.
    let error = store.acquire(&source, &RegistryCredentials::none()).expect_err("cached but private");
    assert!(matches!(error, ImageError::AccessDenied { .. }), "{error}");
}

#[test]
fn concurrent_acquires_of_one_new_image_import_it_once() {
    let registry = Registry::start(None);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("layout");
    write_layout(&layout, "shared");
    registry.push(&layout, "team/shared", "v1");
    let root = work.path().join("cache");
    let image = registry.image("team/shared", "v1");
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (root, image) = (&root, image.clone());
                // One store per thread, as each supervisor process opens its own.
                scope.spawn(move || {
                    let store = ImageStore::open(root, options()).expect("store");
                    store.acquire(&ImageSource::Registry(image), &RegistryCredentials::none())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread").expect("acquire")).collect()
    });
    assert_eq!(results.iter().filter(|r| r.imported).count(), 1, "exactly one import");
    assert!(results.iter().all(|r| r.digest == results[0].digest));
    check_tiny(&results[0].rootfs, "shared");
}

#[test]
fn image_files_squashfs_docker_and_oci_archives() {
    let mksquashfs = require("mksquashfs", "squashfs-tools");
    require("unsquashfs", "squashfs-tools");
    let work = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(&work.path().join("cache"), options()).expect("store");
    let none = RegistryCredentials::none();
    let open =
        |path: &Path| ImageSource::File { file: fs::File::open(path).expect("open"), path: path.display().to_string() };

    // Squashfs, named like an archive: the content decides.
    let tree = work.path().join("tree");
    fs::create_dir_all(tree.join("usr/bin")).expect("mkdir");
    fs::write(tree.join("usr/bin/tool"), b"#!/bin/sh\n").expect("write");
    let squashfs = work.path().join("image.tar");
    let output = Command::new(mksquashfs)
        .arg(&tree)
        .arg(&squashfs)
        .args(["-noappend", "-quiet", "-no-progress", "-no-xattrs"])
        .output()
        .expect("run mksquashfs");
    assert!(output.status.success(), "mksquashfs: {}", String::from_utf8_lossy(&output.stderr));
    let image = store.acquire(&open(&squashfs), &none).expect("squashfs");
    assert!(image.imported);
    assert_eq!(image.digest, sha(&fs::read(&squashfs).expect("read")));
    assert_eq!(fs::read(image.rootfs.join("usr/bin/tool")).expect("tool"), b"#!/bin/sh\n");
    assert_eq!(image.config, Default::default());
    assert!(!store.acquire(&open(&squashfs), &none).expect("again").imported);

    // OCI archive: a tar of the layout; its entry is the manifest's digest.
    let layout = work.path().join("layout");
    let manifest_digest = write_layout(&layout, "oci");
    let oci = work.path().join("image.sqsh");
    let mut builder = tar::Builder::new(fs::File::create(&oci).expect("create"));
    builder.append_dir_all(".", &layout).expect("tar layout");
    builder.finish().expect("finish");
    drop(builder);
    let image = store.acquire(&open(&oci), &none).expect("oci archive");
    assert_eq!(image.digest, manifest_digest);
    check_tiny(&image.rootfs, "oci");
    assert_eq!(image.config.working_dir.as_deref(), Some("/opt"));

    // Docker archive (docker save): manifest.json, the config, one uncompressed layer.tar per layer, the second a
    // symlink to the first's (docker save shares repeated layers so).
    let lower = layer(&[("etc/", b""), ("etc/hello", b"from layer one"), ("etc/remove-me", b"x")]);
    let upper = layer(&[("etc/.wh.remove-me", b""), ("opt/", b""), ("opt/variant", b"docker")]);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Entrypoint":["/init"]}},"rootfs":{{"type":"layers","diff_ids":["{}","{}","{}"]}}}}"#,
        sha(&lower),
        sha(&upper),
        sha(&lower)
    );
    let config_name = format!("{}.json", &sha(config.as_bytes())[7..]);
    let manifest = format!(
        r#"[{{"Config":"{config_name}","RepoTags":["tiny:v1"],"Layers":["l1/layer.tar","l2/layer.tar","l3/layer.tar"]}}]"#
    );
    let docker = work.path().join("saved");
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("manifest.json", manifest.as_bytes()),
        (config_name.as_str(), config.as_bytes()),
        ("l1/layer.tar", lower.as_slice()),
        ("l2/layer.tar", upper.as_slice()),
    ] {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, data).expect("append");
    }
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    builder.append_link(&mut header, "l3/layer.tar", "../l1/layer.tar").expect("link");
    fs::write(&docker, builder.into_inner().expect("tar")).expect("write");
    let image = store.acquire(&open(&docker), &none).expect("docker archive");
    assert!(image.imported);
    assert_eq!(image.digest, sha(config.as_bytes()));
    assert_eq!(fs::read(image.rootfs.join("etc/hello")).expect("hello"), b"from layer one");
    assert_eq!(fs::read(image.rootfs.join("opt/variant")).expect("variant"), b"docker");
    // Whited out by the second layer, then added back by the third (a link to the first): layers apply in order.
    assert_eq!(fs::read(image.rootfs.join("etc/remove-me")).expect("re-added"), b"x");
    assert_eq!(image.config.entrypoint, vec!["/init".to_string()]);

    let junk = work.path().join("junk.sqsh");
    fs::write(&junk, b"not an image at all").expect("write");
    let error = store.acquire(&open(&junk), &none).expect_err("junk");
    assert!(matches!(error, ImageError::UnknownFormat { .. }), "{error}");
    assert!(error.to_string().contains("junk.sqsh"), "{error}");
}

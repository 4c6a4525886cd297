//! Containers end to end, as a lab launches them on Slurm with pyxis: `srun --container-image=... cmd` and
//! `#SBATCH --container-image` against a real local cluster, with images from a squashfs file and from a real
//! registry (Debian's `docker-registry` on loopback, the image pushed with `skopeo`), built in the test from the
//! host's own programs. Each story checks what the task sees inside: the image's files, its own GPUs' devices and
//! no others, the job's user, the mounts it asked for, and that a tenant gains nothing from the image.
//!
//! Needs root (agents mount only then) and the Debian packages `docker-registry`, `skopeo` and `squashfs-tools`
//! (CI installs them). Without root every story says SKIPPED; without a package a story fails naming it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, UpOptions};

mod common;

use common::{Shell, setup};

/// An ordinary tenant (no passwd entry needed).
const ALICE: u32 = 60_011;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

macro_rules! needs_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: agents mount containers only when run as root (CI runs as root)");
            return;
        }
    };
}

fn need(program: &str, package: &str) {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .any(|dir| Path::new(dir).join(program).exists());
    assert!(found, "{program} is missing: install the Debian package {package} (apt-get install -y {package})");
}

/// A small image made of the host's own programs and the libraries they load, with a marker file and a setuid
/// copy of `id` (which must grant nothing inside).
fn build_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for sub in ["bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev", "opt/app"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    let programs = ["sh", "cat", "id", "ls", "pwd", "echo", "sleep", "touch", "env", "grep", "stat", "readlink"];
    for name in programs {
        let host = ["/bin", "/usr/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists());
        let host = host.unwrap_or_else(|| panic!("the host has no {name}"));
        let host = fs::canonicalize(host).unwrap();
        fs::copy(&host, root.join("bin").join(name)).unwrap();
        let ldd = Command::new("ldd").arg(&host).output().unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let lib = line.split_whitespace().find(|w| w.starts_with('/'));
            if let Some(lib) = lib {
                let target = root.join(lib.trim_start_matches('/'));
                fs::create_dir_all(target.parent().unwrap()).unwrap();
                if !target.exists() {
                    fs::copy(lib, &target).unwrap();
                }
            }
        }
    }
    // What `drover rendezvous` (bound in from the host by a story) loads beside libc.
    for lib in ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libm.so.6"] {
        let target = root.join(lib.trim_start_matches('/'));
        if Path::new(lib).exists() && !target.exists() {
            fs::create_dir_all(target.parent().unwrap()).unwrap();
            fs::copy(lib, &target).unwrap();
        }
    }
    fs::copy(root.join("bin/id"), root.join("bin/suid-id")).unwrap();
    fs::set_permissions(root.join("bin/suid-id"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(root.join("etc/os-release"), "PRETTY_NAME=\"Drover test image\"\n").unwrap();
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    fs::write(root.join("opt/app/hello"), "hello from the image\n").unwrap();
    root
}

fn squashfs(root: &Path, out: &Path) {
    need("mksquashfs", "squashfs-tools");
    let status = Command::new("mksquashfs")
        .arg(root)
        .arg(out)
        .args(["-noappend", "-quiet", "-no-progress", "-all-root"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    fs::set_permissions(out, fs::Permissions::from_mode(0o644)).unwrap();
}

fn cluster(dir: &Path) -> (LocalCluster, Shell) {
    cluster_with(dir, "containers = { image_store_limit_mb = 2048, shm_mb = 64 }")
}

/// A one-controller cluster of two nodes (two simulated GPUs each) whose agents get `containers` as their
/// container settings.
fn cluster_with(dir: &Path, containers: &str) -> (LocalCluster, Shell) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    let options = UpOptions {
        controllers: 1,
        agents: 2,
        gpus_per_agent: 2,
        kill_wait_ms: 1_000,
        agent_toml: vec![containers.to_string(), containers.to_string()],
        ..UpOptions::default()
    };
    let (cluster, sh) = setup(dir, options);
    fs::set_permissions(&sh.cwd, fs::Permissions::from_mode(0o777)).unwrap();
    (cluster, sh)
}

/// `srun ARGS` from the work directory, as `uid`: exit code, stdout, stderr.
fn srun(sh: &Shell, uid: u32, args: &[&str]) -> (i32, String, String) {
    let mut command = sh.command("srun", args);
    if uid != 0 {
        command.uid(uid).gid(uid);
    }
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn srun_runs_a_squashfs_image_with_its_own_files_devices_and_mounts() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = cluster(dir.path());
    let root = build_rootfs(dir.path());
    let image = sh.cwd.join("test.sqsh");
    squashfs(&root, &image);
    fs::create_dir_all(sh.cwd.join("data")).unwrap();
    fs::write(sh.cwd.join("data/input.txt"), "from the host\n").unwrap();
    fs::set_permissions(sh.cwd.join("data"), fs::Permissions::from_mode(0o777)).unwrap();

    let script = "cat /etc/os-release /opt/app/hello /data/input.txt; echo uid=$(id -u) cwd=$(pwd); \
                  echo devices: $(ls /dev); echo suid=$(suid-id -u); echo shm=$(stat -f -c %b /dev/shm); \
                  touch /tmp/scratch && echo wrote; echo job=$SLURM_JOB_ID; \
                  echo gpus=$CUDA_VISIBLE_DEVICES node=$DROVER_NODE_GPUS slurm=$SLURM_JOB_GPUS";
    let (code, out, err) = srun(
        &sh,
        ALICE,
        &["-N1", "--gpus=1", "--container-image=./test.sqsh", "--container-mounts=./data:/data:ro", "sh", "-c", script],
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("Drover test image") && out.contains("hello from the image"), "{out}");
    assert!(out.contains("from the host"), "the mount is there: {out}");
    assert!(out.contains(&format!("uid={ALICE} cwd=/")), "the job's user, in the image's working directory: {out}");
    assert!(out.contains(&format!("suid={ALICE}")), "a setuid binary of the image grants nothing: {out}");
    let devices = out.lines().find(|l| l.starts_with("devices:")).unwrap();
    for wanted in ["null", "zero", "urandom", "shm", "pts"] {
        assert!(devices.contains(wanted), "{devices}");
    }
    assert!(!devices.contains("sda") && !devices.contains("vda") && !devices.contains("kmsg"), "{devices}");
    // Exactly its own GPU, through the simulated node's CDI spec; CUDA numbers it 0 inside.
    let gpus = out.lines().find(|l| l.starts_with("gpus=")).unwrap();
    let held = gpus.rsplit("slurm=").next().unwrap();
    assert!(gpus.starts_with(&format!("gpus=0 node={held} ")), "{gpus}");
    let nodes: Vec<&str> = devices
        .split_whitespace()
        .filter(|d| d.starts_with("nvidia") && d[6..].chars().all(|c| c.is_ascii_digit()) && d.len() > 6)
        .collect();
    assert_eq!(nodes, [format!("nvidia{held}")], "{devices}");
    assert!(devices.contains("nvidiactl"), "{devices}");
    assert!(out.contains("wrote"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("job=") && l.len() > 4), "Slurm's variables inside: {out}");

    // The mount is read-only; the image's root-owned files are not the tenant's.
    let (code, _, err) =
        srun(&sh, ALICE, &["--container-image=./test.sqsh", "--container-mounts=./data:/data:ro", "touch", "/data/x"]);
    assert_ne!(code, 0, "wrote through a read-only mount");
    assert!(err.contains("Read-only file system"), "{err}");

    // Remapped to root inside, still the tenant outside: a file made in a writable mount is the tenant's.
    let (code, out, err) = srun(
        &sh,
        ALICE,
        &[
            "--container-image=./test.sqsh",
            "--container-remap-root",
            "--container-mounts=./data:/data",
            "sh",
            "-c",
            "id -u; touch /data/made-as-root; echo patched > /etc/os-release && stat -c %u /etc/os-release /bin",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["0", "0", "0"], "root inside, owning the image's files");
    let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(sh.cwd.join("data/made-as-root")).unwrap());
    assert_eq!(owner, ALICE, "root inside is the tenant outside");

    // Without remapping the image's files are the tenant's own in their container (as enroot unpacks them), so a
    // package can be installed into it; the image itself never changes for the next container.
    let (code, out, err) = srun(
        &sh,
        ALICE,
        &["--container-image=./test.sqsh", "sh", "-c", "echo mine >> /opt/app/hello && cat /opt/app/hello && id -u"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, format!("hello from the image\nmine\n{ALICE}\n"));
    let (_, out, _) = srun(&sh, ALICE, &["--container-image=./test.sqsh", "cat", "/opt/app/hello"]);
    assert_eq!(out, "hello from the image\n", "a new container starts from the image as it was");

    // Bad input: each a clear error, nothing started.
    let (code, _, err) = srun(&sh, ALICE, &["--container-image=./missing.sqsh", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("missing.sqsh") && err.contains("No such file"), "{err}");
    let (code, _, err) = srun(&sh, ALICE, &["--container-image=Bad Name", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid --container-image value"), "{err}");
    let (code, _, err) = srun(&sh, ALICE, &["--container-imag=x", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("container"), "{err}");

    // A file the tenant cannot reach on the node (in root's 0700 directory) cannot be reached by mounting it either:
    // the mount is made as root, but from the source as the tenant opened it.
    let vault = dir.path().join("vault");
    fs::create_dir(&vault).unwrap();
    fs::set_permissions(&vault, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(vault.join("secret"), "root's secret\n").unwrap();
    fs::set_permissions(vault.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
    let mount = format!("--container-mounts={}:/stolen", vault.join("secret").display());
    let (code, out, err) = srun(&sh, ALICE, &["--container-image=./test.sqsh", &mount, "cat", "/stolen"]);
    assert_ne!(code, 0, "read root's file: {out}");
    assert!(!out.contains("secret") && err.contains("cannot mount") && err.contains("Permission denied"), "{err}");

    // Once the jobs have left, their containers are unmounted and gone; the node's image store stays.
    let prefix = dir.path().display().to_string();
    let start = Instant::now();
    loop {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let left: Vec<&str> = info.lines().filter(|l| l.contains(&prefix) && l.contains("/containers/")).collect();
        if left.is_empty() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "mounts left behind: {left:#?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_named_container_keeps_its_changes_for_the_jobs_next_step_and_a_batch_script_runs_inside() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = cluster(dir.path());
    let root = build_rootfs(dir.path());
    squashfs(&root, &sh.cwd.join("test.sqsh"));
    let script = "#!/bin/sh\n\
                  #SBATCH --container-image=./test.sqsh\n\
                  #SBATCH -o batch.out\n\
                  cat /etc/os-release\n\
                  echo batch in $(pwd) as $(id -u)\n";
    fs::write(sh.cwd.join("job.sh"), script).unwrap();
    let mut command = sh.command("sbatch", &["--parsable", "--wait", "job.sh"]);
    let out = command.uid(ALICE).gid(ALICE).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let batch = fs::read_to_string(sh.cwd.join("batch.out")).unwrap();
    assert!(batch.contains("Drover test image") && batch.contains(&format!("as {ALICE}")), "{batch}");

    // Two steps of one allocation share the named container's writable layer.
    let steps = "srun --container-image=./test.sqsh --container-name=dev sh -c 'echo kept > /tmp/state' && \
                 srun --container-name=dev cat /tmp/state";
    let mut command = sh.command("salloc", &["-N1", "sh", "-c", steps]);
    let out = command.uid(ALICE).gid(ALICE).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("kept"), "{stdout}");

    // An allocation's container is its steps' unless they name their own.
    let mut command =
        sh.command("salloc", &["-N1", "--container-image=./test.sqsh", "sh", "-c", "srun cat /opt/app/hello"]);
    let out = command.uid(ALICE).gid(ALICE).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("hello from the image"), "{stdout}{}", String::from_utf8_lossy(&out.stderr));

    // --container-save writes the container as the tenant left it; it runs as an image of its own.
    let save = "echo saved > /opt/app/note";
    let (code, out, err) =
        srun(&sh, ALICE, &["--container-image=./test.sqsh", "--container-save=./saved.sqsh", "sh", "-c", save]);
    assert_eq!(code, 0, "{out}{err}");
    let saved = sh.cwd.join("saved.sqsh");
    let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&saved).unwrap());
    assert_eq!(owner, ALICE, "written as the tenant");
    let (code, out, err) = srun(&sh, ALICE, &["--container-image=./saved.sqsh", "cat", "/opt/app/note"]);
    assert_eq!((code, out.as_str()), (0, "saved\n"), "{err}");
}

/// A `docker-registry` on a free loopback port, its storage in `dir`.
struct Registry {
    child: Child,
    addr: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry(dir: &Path) -> Registry {
    need("docker-registry", "docker-registry");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let config = dir.join("registry.yml");
    let storage = dir.join("registry-data");
    fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            storage.display()
        ),
    )
    .unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "docker-registry did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Registry { child, addr }
}

/// Pushes `rootfs` as a one-layer image `repo:tag` (an OCI layout made with umoci, copied with skopeo), with the
/// variables `env` (`ENTRYPOINT=x` entries are the entrypoint's words instead).
fn push(dir: &Path, rootfs: &Path, registry: &str, repo_tag: &str, env: &[&str]) {
    need("skopeo", "skopeo");
    need("umoci", "umoci");
    let layout = dir.join(format!("layout-{}", repo_tag.replace(['/', ':'], "-")));
    let _ = fs::remove_dir_all(&layout);
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let image = format!("{}:v", layout.display());
    run("umoci", &["init", "--layout", &layout.display().to_string()]);
    run("umoci", &["new", "--image", &image]);
    let bundle = dir.join("bundle");
    let _ = fs::remove_dir_all(&bundle);
    run("umoci", &["unpack", "--rootless", "--image", &image, &bundle.display().to_string()]);
    let _ = fs::remove_dir_all(bundle.join("rootfs"));
    run("cp", &["-a", &rootfs.display().to_string(), &bundle.join("rootfs").display().to_string()]);
    run("umoci", &["repack", "--image", &image, &bundle.display().to_string()]);
    let mut config = vec!["config", "--image", &image, "--config.workingdir", "/opt/app"];
    for e in env {
        if let Some(entrypoint) = e.strip_prefix("ENTRYPOINT=") {
            config.extend(["--config.entrypoint", entrypoint]);
        } else {
            config.extend(["--config.env", e]);
        }
    }
    run("umoci", &config);
    run(
        "skopeo",
        &["copy", "--dest-tls-verify=false", &format!("oci:{image}"), &format!("docker://{registry}/{repo_tag}")],
    );
}

#[test]
fn a_two_node_job_runs_a_registry_image_pulled_once_per_node_and_a_moved_tag_is_noticed() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path());
    let rootfs = build_rootfs(dir.path());
    let env = ["PATH=/bin:/usr/bin", "FROM_IMAGE=yes", "ENTRYPOINT=/bin/echo", "ENTRYPOINT=from-entrypoint"];
    push(dir.path(), &rootfs, &registry.addr, "team/tiny:v1", &env);
    let (_cluster, sh) = cluster(dir.path());

    // pyxis's own spelling: REGISTRY#IMAGE:TAG, two nodes, two tasks each; the ranks meet over TCP at
    // MASTER_ADDR:MASTER_PORT from inside their containers, as torch.distributed's env:// rendezvous does.
    let image = format!("--container-image={}#team/tiny:v1", registry.addr);
    let tools = format!("--container-mounts={}:/drover:ro", common::drover_dir().display());
    let script = "echo rank=$SLURM_PROCID cwd=$(pwd) image=$FROM_IMAGE && /drover/drover rendezvous";
    let (code, out, err) = srun(&sh, ALICE, &["-N2", "--ntasks-per-node=2", &image, &tools, "sh", "-c", script]);
    assert_eq!(code, 0, "{out}{err}");
    let configured: Vec<&str> = out.lines().filter(|l| l.starts_with("rank=")).collect();
    let mut ranks: Vec<&str> = configured.iter().map(|l| &l[..6]).collect();
    ranks.sort();
    assert_eq!(ranks, ["rank=0", "rank=1", "rank=2", "rank=3"], "{out}");
    let from_image = configured.iter().all(|l| l.contains("cwd=/opt/app") && l.contains("image=yes"));
    assert!(from_image, "the image's config: {out}");
    assert!(out.contains("rank 0/4: all 4 ranks met at"), "the ranks met: {out}");

    // The image's entrypoint runs only when asked, with the task's command as its arguments.
    let (code, out, err) = srun(&sh, ALICE, &[&image, "--container-entrypoint", "echo", "task"]);
    assert_eq!((code, out.as_str()), (0, "from-entrypoint echo task\n"), "{err}");
    let (_, out, _) = srun(&sh, ALICE, &[&image, "echo", "task"]);
    assert_eq!(out, "task\n");

    // The tag moves: the next job runs the new image, not the cached one.
    fs::write(rootfs.join("opt/app/hello"), "hello from v2\n").unwrap();
    push(dir.path(), &rootfs, &registry.addr, "team/tiny:v1", &["PATH=/bin:/usr/bin"]);
    let (code, out, err) = srun(&sh, ALICE, &[&image, "cat", "/opt/app/hello"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "hello from v2");

    // An unknown tag and an unreachable registry: clear errors, the job fails, nothing else.
    let (code, _, err) = srun(&sh, ALICE, &[&format!("--container-image={}#team/tiny:nope", registry.addr), "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("nope") && err.contains("container"), "{err}");
    let (code, _, err) = srun(&sh, ALICE, &["--container-image=127.0.0.1:9#team/tiny:v1", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("127.0.0.1:9"), "{err}");

    // Each node tells the controllers what its image cache holds (both images, once each).
    let start = Instant::now();
    loop {
        let shown = sh.ok("scontrol", &["show", "node", "node01"]);
        if shown.contains("ContainerImages=2 ") {
            assert!(shown.contains("ImageCacheLimit=2G"), "{shown}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "the node's image cache is not shown: {shown}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits for `path` to exist and returns its content.
fn wait_for_file(path: &Path, patience: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = fs::read_to_string(path)
            && !text.is_empty()
        {
            return text;
        }
        assert!(start.elapsed() < patience, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_requeued_job_restarts_in_the_image_digest_it_first_ran_though_its_tag_moved() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path());
    let rootfs = build_rootfs(dir.path());
    push(dir.path(), &rootfs, &registry.addr, "team/train:latest", &["PATH=/bin:/usr/bin"]);
    let (_cluster, sh) = cluster(dir.path());
    let data = sh.cwd.join("data");
    fs::create_dir_all(&data).unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "#!/bin/sh\n#SBATCH --container-image={}/team/train:latest\n#SBATCH --container-mounts=./data:/data\n\
         cat /opt/app/hello > /data/run-${{SLURM_RESTART_COUNT:-0}}\nsleep 300\n",
        registry.addr
    );
    fs::write(sh.cwd.join("train.sh"), script).unwrap();
    let as_alice = |name: &str, args: &[&str]| {
        let out = sh.command(name, args).uid(ALICE).gid(ALICE).output().unwrap();
        assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let id = as_alice("sbatch", &["--parsable", "-o", "train.out", "train.sh"]).trim().to_string();
    assert_eq!(wait_for_file(&data.join("run-0"), Duration::from_secs(60)), "hello from the image\n");
    let start = Instant::now();
    let digest = loop {
        let shown = as_alice("scontrol", &["show", "job", &id]);
        if let Some(at) = shown.find("ContainerDigest=") {
            break shown[at + "ContainerDigest=".len()..].split_whitespace().next().unwrap().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no digest recorded: {shown}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(digest.starts_with("sha256:"), "{digest}");

    // The tag moves to a new image; the requeued job must not train on in it.
    fs::write(rootfs.join("opt/app/hello"), "hello from a newer image\n").unwrap();
    push(dir.path(), &rootfs, &registry.addr, "team/train:latest", &["PATH=/bin:/usr/bin"]);
    as_alice("scontrol", &["requeue", &id]);
    assert_eq!(wait_for_file(&data.join("run-1"), Duration::from_secs(60)), "hello from the image\n");
    let container = as_alice("sacct", &["-X", "-n", "-P", "-j", &id, "-o", "Container"]);
    assert!(container.trim().ends_with(&digest), "sacct shows the digest: {container}");
    as_alice("scancel", &[&id]);
}

/// A tmpfs mounted for a story, unmounted when it ends.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_image_cache_and_an_image_file_the_user_may_not_read_are_clear_errors() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("small-store");
    fs::create_dir_all(&store).unwrap();
    let mounted =
        Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"]).arg(&store).status().unwrap();
    assert!(mounted.success());
    let _store = Tmpfs(store.clone());
    let (_cluster, sh) = cluster_with(dir.path(), &format!("containers = {{ image_store = {:?} }}", store.display()));
    let root = build_rootfs(dir.path());
    squashfs(&root, &sh.cwd.join("test.sqsh"));

    let (code, _, err) = srun(&sh, ALICE, &["--container-image=./test.sqsh", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("is full") && err.contains("test.sqsh"), "{err}");
    let left: Vec<String> = fs::read_dir(&store)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("sha256"))
        .collect();
    assert!(left.is_empty(), "no half-imported image stays behind: {left:?}");

    // Another user's image, readable by its owner only.
    let private = sh.cwd.join("private.sqsh");
    fs::copy(sh.cwd.join("test.sqsh"), &private).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
    let (code, _, err) = srun(&sh, ALICE, &["--container-image=./private.sqsh", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("private.sqsh") && err.contains("Permission denied"), "{err}");
}

#[test]
fn a_containers_gpus_come_from_the_nodes_cdi_spec_and_its_hooks_run_before_the_task() {
    needs_root!();
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("cdi");
    fs::create_dir_all(host.join("dev")).unwrap();
    fs::write(host.join("dev/gpu-a"), "card-a\n").unwrap();
    fs::write(host.join("dev/gpu-b"), "card-b\n").unwrap();
    fs::write(host.join("libfake.so"), "driver library\n").unwrap();
    // A hook as nvidia-ctk's are: it reads the OCI state on stdin, finds the container's root through the
    // bundle's config.json, sees the spec's mounts there, and leaves its mark.
    let hook = host.join("hook.sh");
    fs::write(
        &hook,
        "#!/bin/sh\nstate=$(cat)\nbundle=$(echo \"$state\" | sed 's/.*\"bundle\":\"\\([^\"]*\\)\".*/\\1/')\n\
         root=$(sed 's/.*\"root\":{\"path\":\"\\([^\"]*\\)\".*/\\1/' \"$bundle/config.json\")\n\
         test -f \"$root/usr/lib/libfake.so\" || exit 3\necho \"$1 $HOOK_ENV\" > \"$root/etc/hook-ran\"\n",
    )
    .unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            { "name": "0", "containerEdits": { "deviceNodes": [
                { "path": "/dev/nvidia0", "hostPath": host.join("dev/gpu-a").display().to_string() } ] } },
            { "name": "1", "containerEdits": { "deviceNodes": [
                { "path": "/dev/nvidia1", "hostPath": host.join("dev/gpu-b").display().to_string() } ] } },
        ],
        "containerEdits": {
            "env": ["FAKE_DRIVER=1"],
            "mounts": [{ "hostPath": host.join("libfake.so").display().to_string(),
                         "containerPath": "/usr/lib/libfake.so", "options": ["ro", "nosuid", "nodev", "bind"] }],
            "hooks": [{ "hookName": "createContainer", "path": hook.display().to_string(),
                        "args": ["hook.sh", "ran"], "env": ["HOOK_ENV=given"] }],
        },
    });
    let spec_path = host.join("nvidia.json");
    fs::write(&spec_path, spec.to_string()).unwrap();
    let (_cluster, sh) = cluster_with(dir.path(), &format!("containers = {{ cdi_spec = {:?} }}", spec_path.display()));
    let root = build_rootfs(dir.path());
    squashfs(&root, &sh.cwd.join("test.sqsh"));

    let script = "cat /dev/nvidia*; cat /etc/hook-ran /usr/lib/libfake.so; echo driver=$FAKE_DRIVER";
    let (code, out, err) = srun(&sh, ALICE, &["--gpus=1", "--container-image=./test.sqsh", "sh", "-c", script]);
    assert_eq!(code, 0, "{out}{err}");
    let cards = out.lines().filter(|l| l.starts_with("card-")).count();
    assert_eq!(cards, 1, "exactly the job's one GPU: {out}");
    assert!(out.contains("ran given\n") && out.contains("driver library\n") && out.contains("driver=1\n"), "{out}");

    // A hook that fails stops the task with a message naming it.
    fs::write(&hook, "#!/bin/sh\nexit 5\n").unwrap();
    let (code, _, err) = srun(&sh, ALICE, &["--gpus=1", "--container-image=./test.sqsh", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("CDI hook hook.sh ran"), "{err}");
}

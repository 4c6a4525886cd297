//! Containers on the node: pyxis's `--container-*` options carried out by the task's supervisor, without a
//! container daemon and without a setuid helper.
//!
//! # How a task enters its container
//!
//! ```text
//! supervisor (root, host namespaces)                      task process, between fork and exec
//! ─────────────────────────────────                       ─────────────────────────────────────
//! image from the node's store (pulled once per digest)    joins the job's cgroups, own process group
//! container dir locked; rootfs mounted once:              unshare(CLONE_NEWNS), every mount private
//!   overlayfs  lower = image, upper = the job's layer     /proc, a fresh /dev (null, zero, ..., its GPUs),
//!   nosuid,nodev (read-only: no upper)                      /dev/shm sized for NCCL, /sys read-only,
//! mount points made inside (no symlink followed)            /etc/hosts, passwd, user's mounts, $HOME, ...
//! /etc/passwd and group with the job's user               pivot_root into the rootfs, old root detached
//! the task's environment, argv and cwd worked out         the job's user (or root inside a user namespace
//!                                                           mapped to the job's user: --container-remap-root)
//!                                                         no_new_privs; chdir; exec
//! ```
//!
//! The rootfs of a container is mounted once per container and node in the host's namespace (under the agent's
//! state directory, root's alone), so the tasks of one step share one writable layer, and a named container's
//! layer outlives its step for the job's later steps (pyxis's `--container-name`, scope: the job). The agent
//! unmounts and deletes a job's containers once the job has left the node (see `NodeAgent::tend_containers`).
//!
//! # The privilege boundary
//!
//! An image is untrusted input run by an unprivileged user. Its setuid binaries and file capabilities grant
//! nothing: the rootfs is mounted nosuid and nodev, the importer drops xattrs and device nodes, and the task runs
//! with no_new_privs. The task never holds a capability in the host's user namespace: it runs as the job's user,
//! or as root of a user namespace of its own whose only member is the job's user (so "root" inside can write what
//! the user can and nothing else). Its mount namespace is owned by the host's user namespace, so it cannot mount
//! or unmount anything. It sees only its own GPUs' device nodes: `/dev` is a fresh tmpfs.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use drover_state::container::{ContainerSpec, ImageRef, MountSource};
use serde::{Deserialize, Serialize};

use crate::image::{ImageSource, ImageStore, RegistryCredentials, StoreOptions};

/// What a task's launch file says about its container (written by the agent, read by the supervisor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerLaunch {
    pub spec: ContainerSpec,
    /// The node's image store.
    pub store: String,
    pub store_limit_bytes: u64,
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// This container's directory (`<state>/containers/JOB.INCARNATION/NAME`): its lock, rootfs mount point,
    /// writable layer and what was mounted from which image.
    pub dir: String,
    /// Size of `/dev/shm` inside, in bytes (NCCL moves data through it between the GPUs of a node).
    pub shm_bytes: u64,
    /// Device nodes on the host for the job's GPUs here (`/dev/nvidia0`, and `/dev/nvidiactl`, `/dev/nvidia-uvm`
    /// when there are any): bound into the container's `/dev`, and no other.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Host paths bound at the same path inside, read-write: the job's checkpoint directory.
    #[serde(default)]
    pub binds: Vec<String>,
    /// A host file bound read-only at the same path inside: the batch script.
    #[serde(default)]
    pub script: Option<String>,
    /// This task saves the container (`--container-save`): the node's first local task only.
    #[serde(default)]
    pub save_here: bool,
    /// What the node's CDI spec gives the job's GPUs (device nodes, driver mounts, variables), or why it could
    /// not be read (the task then fails with that reason rather than run without its GPUs).
    #[serde(default)]
    pub cdi: Option<crate::cdi::CdiEdits>,
    #[serde(default)]
    pub cdi_error: Option<String>,
    /// Entries of `/proc/driver/nvidia/gpus` (by PCI address) of GPUs the job does not hold: hidden inside, as
    /// NVIDIA's container runtime hides them, so the driver's view matches the devices the task has.
    #[serde(default)]
    pub hidden_gpus: Vec<String>,
}

/// Why a task could not enter its container; the message is what the user reads in the task's stderr.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
    #[error(
        "no container named `{name}` exists for this job on this node; the first step that uses it needs --container-image"
    )]
    NoSuchContainer { name: String },
    #[error("cannot open the image file {path}: {cause}")]
    ImageFile { path: String, cause: io::Error },
    #[error("cannot prepare the container in {dir}: {what}: {cause}")]
    Setup { dir: String, what: String, cause: io::Error },
    #[error("the mount destination {target} is a symbolic link inside the image; mount somewhere else")]
    SymlinkTarget { target: String },
    #[error("the mount destination {target} does not exist in the read-only container; add --container-writable")]
    MissingTarget { target: String },
    #[error("{0}")]
    Cdi(String),
    #[error("the mount source {path} does not exist on this node")]
    MissingSource { path: String },
    #[error("cannot mount {path} in the container: {cause}")]
    MountSource { path: String, cause: io::Error },
}

/// The task a container is prepared for: whose it is, and what it runs.
#[derive(Clone, Copy)]
pub struct Task<'a> {
    pub uid: u32,
    pub gid: u32,
    pub user: &'a str,
    /// The user's home directory on the node, if it has one.
    pub home: Option<&'a str>,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
}

/// A container mounted and ready for the task: what the child does between fork and exec, and what the task gets.
pub struct Ready {
    pub plan: Plan,
    /// The task's environment inside (the image's, then the job's; see [`merge_environment`]).
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
    /// The image's digest, for the record (`sha256:...`).
    pub digest: String,
    /// The container's rootfs on the host (for `--container-save`).
    pub rootfs: PathBuf,
    /// Whether the image's files show as the user's own (see `mount_rootfs`).
    pub idmapped: bool,
}

/// The mounts and switches the task's process makes in its own mount namespace, with every path already a C
/// string: the child runs between fork and exec, where it may not allocate.
pub struct Plan {
    pub rootfs: CString,
    pub ops: Vec<MountOp>,
    /// What each op does, for the error when one fails (by index).
    pub descriptions: Vec<String>,
    /// `--container-remap-root`: root inside a user namespace mapped to this uid and gid outside.
    pub remap: Option<(u32, u32)>,
    /// The working directory inside, entered as the task's user.
    pub cwd: CString,
    /// CDI hooks run once the mounts are made, before pivot_root (as runc runs `createContainer` hooks).
    pub hooks: Vec<HookRun>,
    /// The OCI state the hooks read on stdin, with [`PID_PLACEHOLDER`] spaces at `pid_at` for the task's pid.
    pub hook_state: Vec<u8>,
    pub pid_at: usize,
    /// Detached copies of the user's mount sources (see `PlanBuilder::bind_user`), which the child attaches.
    /// Closed once the task has started (close-on-exec).
    pub held: Vec<std::os::fd::OwnedFd>,
}

/// One hook, ready for the child: its program, argv and environment as C strings.
pub struct HookRun {
    pub path: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
}

/// Room for the pid in [`Plan::hook_state`]: JSON allows spaces after a number.
const PID_PLACEHOLDER: &str = "          ";
/// Largest OCI state handed to a hook (it is a few hundred bytes).
const MAX_HOOK_STATE: usize = 4096;

/// One step of [`Plan::ops`].
pub enum MountOp {
    Mount {
        source: CString,
        target: CString,
        fstype: CString,
        flags: libc::c_ulong,
        data: CString,
    },
    /// A bind mount (recursive unless told otherwise), then a remount with `flags` when any are set (a bind mount
    /// takes read-only and the others only on a remount).
    Bind {
        source: CString,
        target: CString,
        recursive: bool,
        flags: libc::c_ulong,
    },
    Umount {
        target: CString,
    },
    /// A detached mount (`open_tree` clone, a descriptor the child inherited) attached at `target`, then remounted
    /// with `flags` when any are set.
    Attach {
        tree: libc::c_int,
        target: CString,
        flags: libc::c_ulong,
    },
    Mkdir {
        path: CString,
        mode: libc::mode_t,
    },
    /// An empty file to bind a device node or a file onto.
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        link: CString,
    },
}

/// Prepares the task's container on the host: image, rootfs, mount points, files. Runs in the supervisor, as root,
/// before the fork. `home` is the user's home directory; `open_as_user` opens an image file with the user's rights,
/// `credentials` are the user's registry credentials (read as the user).
pub fn prepare(
    c: &ContainerLaunch,
    task: &Task<'_>,
    open_as_user: &dyn Fn(&str) -> io::Result<File>,
    path_as_user: &dyn Fn(&str) -> io::Result<File>,
    credentials: &RegistryCredentials,
) -> Result<Ready, ContainerError> {
    let Task { uid, gid, home, argv, env: task_env, .. } = *task;
    if let Some(why) = &c.cdi_error {
        return Err(ContainerError::Cdi(why.clone()));
    }
    let dir = PathBuf::from(&c.dir);
    let rootfs = dir.join("rootfs");
    let mounted = mount_once(c, task, open_as_user, credentials)?;
    let mut env = merge_environment(task_env, &mounted.env, &c.spec.env);
    if c.cdi.is_some() || !c.devices.is_empty() {
        renumber_gpus(&mut env);
    }
    for (name, value) in c.cdi.iter().flat_map(|cdi| &cdi.env) {
        env.retain(|(n, _)| n != name);
        env.push((name.clone(), value.clone()));
    }
    let argv = if c.spec.entrypoint && !mounted.entrypoint.is_empty() {
        mounted.entrypoint.iter().cloned().chain(argv.iter().cloned()).collect()
    } else {
        argv.to_vec()
    };
    let cwd = c.spec.workdir.clone().or(mounted.working_dir.clone()).filter(|d| !d.is_empty());
    let cwd = cwd.unwrap_or_else(|| "/".to_string());
    let writable = !c.spec.readonly;
    let mut plan =
        PlanBuilder { rootfs: &rootfs, writable, ops: Vec::new(), descriptions: Vec::new(), held: Vec::new() };
    plan.system(c, &dir)?;
    if let Some(script) = &c.script {
        plan.bind(script, script, libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV, true)?;
    }
    for path in &c.binds {
        plan.bind_user(path, path, libc::MS_NOSUID | libc::MS_NODEV, true, path_as_user)?;
    }
    for (host, inside, readonly) in c.cdi.iter().flat_map(|cdi| &cdi.mounts) {
        let flags = libc::MS_NOSUID | libc::MS_NODEV | if *readonly { libc::MS_RDONLY } else { 0 };
        let file = fs::metadata(host).map(|m| !m.is_dir()).unwrap_or(false);
        plan.bind(host, inside, flags, file)?;
    }
    if c.spec.mount_home
        && let Some(home) = home
    {
        plan.bind_user(home, home, libc::MS_NOSUID | libc::MS_NODEV, true, path_as_user)?;
    }
    for m in &c.spec.mounts {
        let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
        if m.readonly {
            flags |= libc::MS_RDONLY;
        }
        if m.noexec {
            flags |= libc::MS_NOEXEC;
        }
        match &m.source {
            MountSource::Path(source) => plan.bind_user(source, &m.target, flags, !m.non_recursive, path_as_user)?,
            MountSource::Tmpfs => {
                plan.target(&m.target, false)?;
                plan.push(
                    MountOp::Mount {
                        source: cstring("tmpfs"),
                        target: plan.inside(&m.target),
                        fstype: cstring("tmpfs"),
                        flags,
                        data: cstring("mode=1777"),
                    },
                    format!("mount a tmpfs at {}", m.target),
                );
            }
            MountSource::Umount => {
                plan.push(MountOp::Umount { target: plan.inside(&m.target) }, format!("unmount {}", m.target));
            }
        }
    }
    let PlanBuilder { ops, mut descriptions, held, .. } = plan;
    let remap = c.spec.remap_root.then_some((uid, gid));
    let (hooks, hook_state, pid_at) = hooks_for(c, &dir, &rootfs, &env, &mut descriptions)?;
    Ok(Ready {
        plan: Plan {
            rootfs: cstring_path(&rootfs),
            ops,
            descriptions,
            remap,
            cwd: cstring(&cwd),
            hooks,
            hook_state,
            pid_at,
            held,
        },
        env,
        argv,
        digest: mounted.digest,
        rootfs,
        idmapped: mounted.idmapped,
    })
}

/// The container's rootfs, mounted by the first task that needs it (under the container's lock) and found mounted
/// by the others: pyxis's rule that a named container is used as it is, whatever image a later step names.
fn mount_once(
    c: &ContainerLaunch,
    task: &Task<'_>,
    open_as_user: &dyn Fn(&str) -> io::Result<File>,
    credentials: &RegistryCredentials,
) -> Result<Mounted, ContainerError> {
    let dir = PathBuf::from(&c.dir);
    let Task { uid, gid, user, home, .. } = *task;
    let setup = |what: &str| {
        let dir = c.dir.clone();
        let what = what.to_string();
        move |cause| ContainerError::Setup { dir, what, cause }
    };
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(setup("create the directory"))?;
    // One task at a time mounts a container; the others of its step (and later steps) find it mounted.
    let lock = OpenOptions::new().create(true).write(true).truncate(false).mode(0o600).open(dir.join("lock"));
    let lock = lock.map_err(setup("open its lock"))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(setup("lock it")(io::Error::last_os_error()));
    }
    let rootfs = dir.join("rootfs");
    let state_path = dir.join("state.json");
    let mounted = match fs::read(&state_path) {
        Ok(bytes) if is_mount_point(&rootfs) => serde_json::from_slice::<Mounted>(&bytes).ok(),
        _ => None,
    };
    match mounted {
        Some(mounted) => Ok(mounted),
        None => {
            let (Some(requested), Some(image)) = (&c.spec.image, c.spec.image_to_run()) else {
                return Err(ContainerError::NoSuchContainer { name: c.spec.name.clone().unwrap_or_default() });
            };
            let store = ImageStore::open(
                Path::new(&c.store),
                StoreOptions {
                    limit_bytes: c.store_limit_bytes,
                    insecure_registries: c.insecure_registries.clone(),
                    ..StoreOptions::default()
                },
            )?;
            let source = match &image {
                ImageRef::Registry(r) => ImageSource::Registry(r.clone()),
                ImageRef::File(path) => ImageSource::File {
                    file: open_as_user(path)
                        .map_err(|cause| ContainerError::ImageFile { path: path.clone(), cause })?,
                    path: path.clone(),
                },
            };
            let cached = store.acquire(&source, credentials)?;
            // Root's jobs see the image as it is; everyone else's see it as their own (see `mount_rootfs`).
            let owner = (uid != 0).then_some((uid, gid));
            let idmapped =
                mount_rootfs(&dir, &cached.rootfs, c.spec.readonly, owner).map_err(setup("mount the image"))?;
            let mounted = Mounted {
                digest: cached.digest.clone(),
                env: cached.config.env.clone(),
                working_dir: cached.config.working_dir.clone(),
                entrypoint: cached.config.entrypoint.clone(),
                image: image.to_string(),
                requested: requested.to_string(),
                idmapped,
            };
            let (passwd, group) = identity_files(&rootfs, uid, gid, user, home, c.spec.remap_root);
            write_file(&dir.join("passwd"), passwd.as_bytes()).map_err(setup("write passwd"))?;
            write_file(&dir.join("group"), group.as_bytes()).map_err(setup("write group"))?;
            let state = serde_json::to_vec(&mounted).expect("serializable");
            write_file(&state_path, &state).map_err(setup("record the mount"))?;
            Ok(mounted)
        }
    }
}

/// The CDI spec's hooks, with what OCI hooks expect of a runtime: the container's state on stdin, and in its bundle
/// (the container's directory) a `config.json` whose `root.path` is the container's root on the host, where
/// nvidia-ctk's hooks find the files to link and the libraries to put in the linker's cache. Their descriptions
/// are appended to `descriptions`, after the mount ops'.
fn hooks_for(
    c: &ContainerLaunch,
    dir: &Path,
    rootfs: &Path,
    env: &[(String, String)],
    descriptions: &mut Vec<String>,
) -> Result<(Vec<HookRun>, Vec<u8>, usize), ContainerError> {
    let hooks: Vec<&crate::cdi::CdiHook> = c.cdi.iter().flat_map(|cdi| &cdi.hooks).collect();
    if hooks.is_empty() {
        return Ok((Vec::new(), Vec::new(), 0));
    }
    let setup = |cause| ContainerError::Setup {
        dir: c.dir.clone(),
        what: "write the OCI config for the CDI hooks".into(),
        cause,
    };
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "root": { "path": rootfs.display().to_string(), "readonly": c.spec.readonly },
        "process": { "env": env.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>() },
    });
    write_file(&dir.join("config.json"), config.to_string().as_bytes()).map_err(setup)?;
    let id = dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let head = serde_json::json!({ "ociVersion": "1.0.2", "id": id, "status": "creating" }).to_string();
    let bundle = serde_json::to_string(&dir.display().to_string()).expect("a string serializes");
    // `{"ociVersion":...,"status":"creating","bundle":"DIR","pid":PID          }`
    let mut state = format!("{},\"bundle\":{bundle},\"pid\":", head.trim_end_matches('}'));
    let pid_at = state.len();
    state.push_str(PID_PLACEHOLDER);
    state.push('}');
    if state.len() > MAX_HOOK_STATE {
        return Err(setup(io::Error::other("the container's directory name is too long for a hook's state")));
    }
    let runs = hooks
        .iter()
        .map(|hook| {
            let argv: Vec<CString> = if hook.args.is_empty() {
                vec![cstring(&hook.path)]
            } else {
                hook.args.iter().map(|a| cstring(a)).collect()
            };
            descriptions.push(format!("run the CDI hook {} (it must exit 0)", hook.args.join(" ")));
            HookRun { path: cstring(&hook.path), argv, env: hook.env.iter().map(|e| cstring(e)).collect() }
        })
        .collect();
    Ok((runs, state.into_bytes(), pid_at))
}

/// What `state.json` records of a mounted container: its image and what the image's config says.
#[derive(Serialize, Deserialize)]
struct Mounted {
    digest: String,
    env: Vec<String>,
    working_dir: Option<String>,
    entrypoint: Vec<String>,
    /// What ran (a pinned digest, once the job has one) and what the job asked for.
    image: String,
    requested: String,
    /// The image's files show as the job's user's (false: root's, where the store cannot be idmapped).
    #[serde(default)]
    idmapped: bool,
}

/// Mounts the image at `dir/rootfs`: an overlay whose upper layer is the container's own (`dir/layer/upper`), or,
/// read-only, the image under an empty layer (overlayfs wants two layers when there is no upper one).
///
/// For a job that is not root's, both layers are idmapped clones first (`dir/lower`, `dir/layer-mapped`), with the
/// image's root (uid 0 on disk) shown as the job's user, as enroot's per-user unpacking gives: the user may change
/// the image's files in their own container (`pip install` into a root-owned site-packages), and under
/// `--container-remap-root` they are root's inside. What the user writes is stored as root's on disk, so the
/// shared image never changes and the next container starts clean.
fn mount_rootfs(dir: &Path, image: &Path, readonly: bool, owner: Option<(u32, u32)>) -> io::Result<bool> {
    let make = |name: &str| fs::DirBuilder::new().recursive(true).mode(0o755).create(dir.join(name));
    make("rootfs")?;
    if !readonly {
        make("layer/upper")?;
        make("layer/work")?;
    }
    let mapped = match owner {
        Some((uid, gid)) => match mapped_layers(dir, image, readonly, uid, gid) {
            Ok(()) => true,
            // A store on a file system that cannot be idmapped (NFS, overlayfs), or an older kernel: the image's
            // files stay root's, which costs the user writes into them, not safety.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::EOPNOTSUPP)) =>
            {
                for name in ["layer-mapped", "lower"] {
                    let target = cstring_path(&dir.join(name));
                    // SAFETY: a valid C string; failing means it was not mounted.
                    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
                }
                false
            }
            Err(e) => return Err(e),
        },
        None => false,
    };
    let (lower, layer) =
        if mapped { (dir.join("lower"), dir.join("layer-mapped")) } else { (image.to_path_buf(), dir.join("layer")) };
    let data = if readonly {
        make("empty")?;
        format!("lowerdir={}:{}", lower.display(), dir.join("empty").display())
    } else {
        format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            layer.join("upper").display(),
            layer.join("work").display()
        )
    };
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if readonly {
        flags |= libc::MS_RDONLY;
    }
    let target = cstring_path(&dir.join("rootfs"));
    let data = cstring(&data);
    // SAFETY: valid C strings for the call's duration.
    let rc =
        unsafe { libc::mount(c"overlay".as_ptr(), target.as_ptr(), c"overlay".as_ptr(), flags, data.as_ptr().cast()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(mapped)
}

/// The image and the container's layer as idmapped clones at `dir/lower` and `dir/layer-mapped`.
fn mapped_layers(dir: &Path, image: &Path, readonly: bool, uid: u32, gid: u32) -> io::Result<()> {
    let make = |name: &str| fs::DirBuilder::new().recursive(true).mode(0o755).create(dir.join(name));
    let mapping = idmapping(uid, gid)?;
    make("lower")?;
    idmapped_clone(image, &dir.join("lower"), &mapping)?;
    if !readonly {
        make("layer-mapped")?;
        idmapped_clone(&dir.join("layer"), &dir.join("layer-mapped"), &mapping)?;
    }
    Ok(())
}

/// `name` opened as an `O_PATH` descriptor (relative to `dir`, or absolute), never through a symlink.
fn open_beneath(dir: Option<&File>, name: &CString, kind: libc::c_int) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    let base = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat on a descriptor we own (or AT_FDCWD) and a C string; the result is a new descriptor.
    let fd = unsafe { libc::openat(base, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC | kind) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A detached copy of the mount at `source` (an open descriptor), with what is mounted below it when `recursive`.
fn detached_tree(source: &File, recursive: bool) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: open_tree on a descriptor we own and an empty path; the result is a new descriptor.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), c"".as_ptr(), flags) };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a descriptor nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(tree as libc::c_int) })
}

/// The mounts a container leaves in its directory, the overlay first.
const CONTAINER_MOUNTS: [&str; 3] = ["rootfs", "layer-mapped", "lower"];

/// A user namespace whose ids swap root and the job's user (`0 UID 1`, `UID 0 1`), as a descriptor for idmapped
/// mounts: on-disk root shows as the user. The swap, not a single line, because overlayfs itself creates its work
/// files as root through the mapped layer, and an unmapped root could not. A short-lived child makes the
/// namespace; the supervisor (root) writes its maps and keeps a descriptor to it.
fn idmapping(uid: u32, gid: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let (mut ready, mut go) = ([0 as libc::c_int; 2], [0 as libc::c_int; 2]);
    // SAFETY (this block): pipes and a fork; the child only unshares, writes a byte, waits for EOF and exits.
    let child = unsafe {
        if libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0 || libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        let child = libc::fork();
        if child == 0 {
            libc::close(ready[0]);
            libc::close(go[1]);
            let byte = u8::from(libc::unshare(libc::CLONE_NEWUSER) == 0);
            libc::write(ready[1], (&byte as *const u8).cast(), 1);
            let mut end = 0u8;
            libc::read(go[0], (&mut end as *mut u8).cast(), 1);
            libc::_exit(0);
        }
        libc::close(ready[1]);
        libc::close(go[0]);
        child
    };
    // SAFETY: descriptors this process owns from here on.
    let (ready, go) = unsafe { (File::from_raw_fd(ready[0]), std::os::fd::OwnedFd::from_raw_fd(go[1])) };
    let result = (|| {
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut byte = [0u8];
        (&ready).read_exact(&mut byte)?;
        if byte[0] != 1 {
            return Err(io::Error::other("cannot make a user namespace for the image's idmapping"));
        }
        let map = format!("0 {uid} 1\n{uid} 0 1\n");
        fs::write(format!("/proc/{child}/uid_map"), &map)?;
        fs::write(format!("/proc/{child}/gid_map"), format!("0 {gid} 1\n{gid} 0 1\n"))?;
        Ok(std::os::fd::OwnedFd::from(File::open(format!("/proc/{child}/ns/user"))?))
    })();
    drop(go);
    if child > 0 {
        // SAFETY: our own child, which exits once `go` is closed.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
    }
    result
}

/// Mounts a clone of `source` at `target` whose ids are seen through `mapping` (an idmapped mount).
fn idmapped_clone(source: &Path, target: &Path, mapping: &std::os::fd::OwnedFd) -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd};
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let (source, target) = (cstring_path(source), cstring_path(target));
    // SAFETY: open_tree on a valid C string; the result is a descriptor we own.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor.
    let tree = unsafe { std::os::fd::OwnedFd::from_raw_fd(tree as libc::c_int) };
    let attr =
        MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: mapping.as_raw_fd() as u64 };
    // SAFETY: mount_setattr and move_mount on descriptors we own, an empty path and a struct of the size given.
    unsafe {
        if libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The digest of the image `image` (as shown) that one of a job's containers here was mounted from, if any
/// (`dir` is the job's containers directory).
pub fn mounted_digest(dir: &Path, image: &str) -> Option<String> {
    fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let bytes = fs::read(entry.path().join("state.json")).ok()?;
        let mounted: Mounted = serde_json::from_slice(&bytes).ok()?;
        (mounted.requested == image).then_some(mounted.digest)
    })
}

/// Unmounts every container of a job under `dir` (`<state>/containers/JOB.INCARNATION`) and removes it.
///
/// Never recursively through a mount point: `lower` is an idmapped clone of the node's shared image, and a
/// recursive delete that crossed into it (a mount missed, or one made again meanwhile) would delete the image
/// itself. Mount points are unmounted (stacked mounts included) and then removed with rmdir, which refuses one
/// still mounted or not empty; only the container's own layer is removed recursively.
pub fn remove_job_containers(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let container = entry?.path();
        for item in fs::read_dir(&container)? {
            let path = item?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if CONTAINER_MOUNTS.contains(&name.as_str()) {
                unmount_all(&path)?;
                fs::remove_dir(&path)?;
            } else if ["layer", "empty"].contains(&name.as_str()) && !is_mount_point(&path) {
                fs::remove_dir_all(&path)?;
            } else if path.symlink_metadata()?.is_dir() {
                fs::remove_dir(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
        fs::remove_dir(&container)?;
    }
    fs::remove_dir(dir)
}

/// Unmounts whatever is mounted at `path`, however many times (detached: a task still exiting keeps its copy).
fn unmount_all(path: &Path) -> io::Result<()> {
    let target = cstring_path(path);
    for _ in 0..64 {
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = io::Error::last_os_error();
            // EINVAL: nothing (more) is mounted there.
            return if e.raw_os_error() == Some(libc::EINVAL) { Ok(()) } else { Err(e) };
        }
    }
    Err(io::Error::other(format!("{} is still mounted after 64 unmounts", path.display())))
}

/// Whether `path` is the root of a mount (its device differs from its parent's, or the kernel lists it).
fn is_mount_point(path: &Path) -> bool {
    let (Ok(here), Some(Ok(parent))) = (fs::metadata(path), path.parent().map(fs::metadata)) else {
        return false;
    };
    if here.dev() != parent.dev() {
        return true;
    }
    // Overlayfs over a directory of the same filesystem still has its own device; a bind mount may not.
    let wanted = path.display().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| info.lines().any(|line| line.split(' ').nth(4) == Some(wanted.as_str())))
}

struct PlanBuilder<'a> {
    rootfs: &'a Path,
    writable: bool,
    ops: Vec<MountOp>,
    descriptions: Vec<String>,
    held: Vec<std::os::fd::OwnedFd>,
}

impl PlanBuilder<'_> {
    fn push(&mut self, op: MountOp, description: String) {
        self.ops.push(op);
        self.descriptions.push(description);
    }

    /// The host path of `inside` (an absolute path in the container), as a C string.
    fn inside(&self, inside: &str) -> CString {
        cstring_path(&self.rootfs.join(inside.trim_start_matches('/')))
    }

    /// Makes sure the mount destination `inside` exists in the rootfs as a directory (or a file), creating what is
    /// missing where the container is writable, and never following a symbolic link the image put on the way (which
    /// could point anywhere on the host).
    fn target(&self, inside: &str, file: bool) -> Result<(), ContainerError> {
        let symlink = || ContainerError::SymlinkTarget { target: inside.to_string() };
        let failed = |what: &str, cause| ContainerError::Setup {
            dir: self.rootfs.display().to_string(),
            what: format!("{what} {inside}"),
            cause,
        };
        // Walked one component at a time relative to the directory before it, never following a symlink: a task of
        // the same named container could swap a directory of the writable layer for a symlink between a check by
        // path and a mkdir by path, and root would then make a directory wherever it pointed.
        let mut dir = open_beneath(None, &cstring_path(self.rootfs), libc::O_DIRECTORY)
            .map_err(|e| failed("open the container's root for", e))?;
        let components: Vec<&str> = inside.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
        for (i, component) in components.iter().enumerate() {
            if *component == ".." {
                return Err(symlink());
            }
            let name = cstring(component);
            let last = i + 1 == components.len();
            let want_file = last && file;
            let kind = if want_file { 0 } else { libc::O_DIRECTORY };
            match open_beneath(Some(&dir), &name, kind) {
                // O_PATH|O_NOFOLLOW opens a symlink itself when no directory is asked for.
                Ok(next) if next.metadata().is_ok_and(|m| m.file_type().is_symlink()) => return Err(symlink()),
                Ok(next) => dir = next,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP)) => return Err(symlink()),
                // A symlink named where a directory is wanted also says ENOTDIR under O_NOFOLLOW|O_DIRECTORY.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR)) && !want_file => {
                    return Err(symlink());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if !self.writable {
                        return Err(ContainerError::MissingTarget { target: inside.to_string() });
                    }
                    // SAFETY: a directory descriptor we own and a C string.
                    let made = unsafe {
                        if want_file {
                            let fd = libc::openat(
                                dir.as_raw_fd(),
                                name.as_ptr(),
                                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                                0o644,
                            );
                            if fd >= 0 { libc::close(fd) } else { -1 }
                        } else {
                            libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755)
                        }
                    };
                    if made != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                        return Err(failed("create the mount point", io::Error::last_os_error()));
                    }
                    if !want_file {
                        dir =
                            open_beneath(Some(&dir), &name, libc::O_DIRECTORY).map_err(|e| match e.raw_os_error() {
                                Some(libc::ELOOP | libc::ENOTDIR) => symlink(),
                                _ => failed("open the mount point", e),
                            })?;
                    }
                }
                Err(e) => return Err(failed("look at", e)),
            }
        }
        Ok(())
    }

    /// A bind mount of a source the node itself chose (a device, the script, a driver library, its files).
    fn bind(&mut self, source: &str, inside: &str, flags: libc::c_ulong, file: bool) -> Result<(), ContainerError> {
        if fs::symlink_metadata(source).is_err() {
            return Err(ContainerError::MissingSource { path: source.to_string() });
        }
        self.target(inside, file)?;
        let op = MountOp::Bind { source: cstring(source), target: self.inside(inside), recursive: true, flags };
        self.push(op, format!("mount {source} at {inside}"));
        Ok(())
    }

    /// A bind mount of a source the user named (`--container-mounts`, `$HOME`, the job's checkpoints). The mount
    /// is made as root, which could reach what the user cannot (a file in a directory the user may not enter), so
    /// the source is opened as the user first (`O_PATH`: the user's right to every directory on the way decides)
    /// and mounted from that descriptor: the object the user could reach is the object mounted.
    fn bind_user(
        &mut self,
        source: &str,
        inside: &str,
        flags: libc::c_ulong,
        recursive: bool,
        path_as_user: &dyn Fn(&str) -> io::Result<File>,
    ) -> Result<(), ContainerError> {
        let refused = |cause| ContainerError::MountSource { path: source.to_string(), cause };
        let opened = path_as_user(source).map_err(refused)?;
        let file = opened.metadata().map(|m| !m.is_dir()).unwrap_or(false);
        // A detached copy of the mount, made here in the host's namespace from what the user opened; the task's
        // process attaches it in its own namespace (a path or a descriptor of the host's namespace could not be
        // mounted from there).
        let tree = detached_tree(&opened, recursive).map_err(refused)?;
        self.target(inside, file)?;
        let op = MountOp::Attach { tree: tree.as_raw_fd(), target: self.inside(inside), flags };
        self.held.push(tree);
        self.push(op, format!("mount {source} at {inside}"));
        Ok(())
    }

    /// What every container gets: `/proc`, a fresh `/dev` with the job's GPUs only, `/dev/shm`, `/sys` read-only,
    /// the node's name resolution, and the job's user in `/etc/passwd` and `/etc/group`.
    fn system(&mut self, c: &ContainerLaunch, dir: &Path) -> Result<(), ContainerError> {
        self.proc_and_sys(c)?;
        self.dev(c)?;
        self.etc_and_tmp(dir)
    }

    /// `/proc` (other GPUs' driver entries hidden) and `/sys` read-only.
    fn proc_and_sys(&mut self, c: &ContainerLaunch) -> Result<(), ContainerError> {
        let quiet = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        self.target("/proc", false)?;
        self.push(
            MountOp::Mount {
                source: cstring("proc"),
                target: self.inside("/proc"),
                fstype: cstring("proc"),
                flags: quiet,
                data: cstring(""),
            },
            "mount /proc".into(),
        );
        for entry in &c.hidden_gpus {
            let inside = format!("/proc/driver/nvidia/gpus/{entry}");
            self.push(
                MountOp::Mount {
                    source: cstring("tmpfs"),
                    target: self.inside(&inside),
                    fstype: cstring("tmpfs"),
                    flags: libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    data: cstring("size=4k"),
                },
                format!("hide {inside}"),
            );
        }
        self.target("/sys", false)?;
        self.push(
            MountOp::Bind {
                source: cstring("/sys"),
                target: self.inside("/sys"),
                recursive: true,
                flags: quiet | libc::MS_RDONLY,
            },
            "mount /sys read-only".into(),
        );
        Ok(())
    }

    /// A fresh `/dev`: the usual character devices, the job's GPUs' nodes, ptys, `/dev/shm` sized for NCCL.
    fn dev(&mut self, c: &ContainerLaunch) -> Result<(), ContainerError> {
        let quiet = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        self.target("/dev", false)?;
        self.push(
            MountOp::Mount {
                source: cstring("tmpfs"),
                target: self.inside("/dev"),
                fstype: cstring("tmpfs"),
                flags: libc::MS_NOSUID | libc::MS_NOEXEC,
                data: cstring("mode=755,size=65536k"),
            },
            "mount a fresh /dev".into(),
        );
        let mut nodes: Vec<(String, String)> = ["null", "zero", "full", "random", "urandom", "tty"]
            .iter()
            .map(|n| (format!("/dev/{n}"), format!("/dev/{n}")))
            .collect();
        nodes.extend(c.devices.iter().map(|d| (d.clone(), d.clone())));
        nodes.extend(c.cdi.iter().flat_map(|cdi| cdi.device_nodes.iter().cloned()));
        for (host, inside) in nodes {
            if fs::metadata(&host).is_err() || !inside.starts_with("/dev/") || inside.contains("/..") {
                continue;
            }
            // Nodes in subdirectories (`/dev/dri/card0`): their directories in the fresh /dev first.
            let mut parent = Path::new(&inside).parent();
            let mut parents = Vec::new();
            while let Some(dir) = parent.filter(|d| *d != Path::new("/dev")) {
                parents.push(dir.display().to_string());
                parent = dir.parent();
            }
            for dir in parents.iter().rev() {
                self.push(MountOp::Mkdir { path: self.inside(dir), mode: 0o755 }, format!("create {dir}"));
            }
            let path = self.inside(&inside);
            self.push(MountOp::Touch { path: path.clone() }, format!("create {inside}"));
            self.push(
                MountOp::Bind { source: cstring(&host), target: path, recursive: false, flags: 0 },
                format!("mount the device {host} at {inside}"),
            );
        }
        for (dir_name, fstype, flags, data) in [
            (
                "/dev/pts",
                "devpts",
                libc::MS_NOSUID | libc::MS_NOEXEC,
                "newinstance,ptmxmode=0666,mode=0620".to_string(),
            ),
            ("/dev/shm", "tmpfs", quiet, format!("mode=1777,size={}", c.shm_bytes.max(1 << 20))),
            ("/dev/mqueue", "mqueue", quiet, String::new()),
        ] {
            self.push(MountOp::Mkdir { path: self.inside(dir_name), mode: 0o755 }, format!("create {dir_name}"));
            self.push(
                MountOp::Mount {
                    source: cstring(fstype),
                    target: self.inside(dir_name),
                    fstype: cstring(fstype),
                    flags,
                    data: cstring(&data),
                },
                format!("mount {dir_name}"),
            );
        }
        for (target, link) in [
            ("pts/ptmx", "/dev/ptmx"),
            ("/proc/self/fd", "/dev/fd"),
            ("/proc/self/fd/0", "/dev/stdin"),
            ("/proc/self/fd/1", "/dev/stdout"),
            ("/proc/self/fd/2", "/dev/stderr"),
        ] {
            self.push(MountOp::Symlink { target: cstring(target), link: self.inside(link) }, format!("link {link}"));
        }
        Ok(())
    }

    /// The node's name resolution, the job's user in `/etc/passwd` and `/etc/group`, `/tmp` when read-only.
    fn etc_and_tmp(&mut self, dir: &Path) -> Result<(), ContainerError> {
        for file in ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"] {
            if fs::metadata(file).is_ok() && (self.writable || self.exists_inside(file)) {
                self.bind(file, file, libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV, true)?;
            }
        }
        for (file, inside) in [("passwd", "/etc/passwd"), ("group", "/etc/group")] {
            if self.writable || self.exists_inside(inside) {
                let source = dir.join(file).display().to_string();
                self.bind(&source, inside, libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV, true)?;
            }
        }
        if !self.writable {
            // A read-only container still needs somewhere to write scratch files.
            self.target("/tmp", false)?;
            self.push(
                MountOp::Mount {
                    source: cstring("tmpfs"),
                    target: self.inside("/tmp"),
                    fstype: cstring("tmpfs"),
                    flags: libc::MS_NOSUID | libc::MS_NODEV,
                    data: cstring("mode=1777"),
                },
                "mount a tmpfs at /tmp".into(),
            );
        }
        Ok(())
    }

    fn exists_inside(&self, inside: &str) -> bool {
        self.target_exists(inside)
    }

    fn target_exists(&self, inside: &str) -> bool {
        let mut path = self.rootfs.to_path_buf();
        for component in inside.split('/').filter(|c| !c.is_empty()) {
            path.push(component);
            match fs::symlink_metadata(&path) {
                Ok(meta) if !meta.file_type().is_symlink() => {}
                _ => return false,
            }
        }
        true
    }
}

/// The container's `/etc/passwd` and `/etc/group`: the image's, with the job's user (and group) in them so that
/// `whoami`, `getpass.getuser()` and ssh-less launchers work. Under `--container-remap-root` the task is root inside
/// and the image's own root entry serves. The image's files are read without following a symbolic link out of it.
fn identity_files(
    rootfs: &Path,
    uid: u32,
    gid: u32,
    user: &str,
    home: Option<&str>,
    remap_root: bool,
) -> (String, String) {
    let read = |inside: &str| {
        let path = rootfs.join(inside);
        let mut text = String::new();
        let opened = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path);
        // `/etc` itself may be a symlink in a hostile image: only read when every component is real.
        let real = rootfs.join("etc").symlink_metadata().is_ok_and(|m| m.is_dir());
        if let (true, Ok(file)) = (real, opened) {
            let _ = file.take(4 << 20).read_to_string(&mut text);
        }
        text
    };
    let mut passwd = read("etc/passwd");
    let mut group = read("etc/group");
    let name = if user.is_empty() { format!("user{uid}") } else { user.to_string() };
    if !remap_root {
        let has_uid = passwd.lines().any(|l| l.split(':').nth(2) == Some(uid.to_string().as_str()));
        if !has_uid {
            passwd.retain(|_| true);
            if !passwd.is_empty() && !passwd.ends_with('\n') {
                passwd.push('\n');
            }
            passwd.push_str(&format!("{name}:x:{uid}:{gid}::{}:/bin/sh\n", home.unwrap_or("/")));
        }
    }
    let has_gid = group.lines().any(|l| l.split(':').nth(2) == Some(gid.to_string().as_str()));
    if !has_gid && !remap_root {
        if !group.is_empty() && !group.ends_with('\n') {
            group.push('\n');
        }
        group.push_str(&format!("{name}:x:{gid}:\n"));
    }
    (passwd, group)
}

/// pyxis's rule: every variable of the job is set inside, but where the image sets one too the image's value wins
/// (its `PATH`, `LD_LIBRARY_PATH`, `CUDA_HOME` are what its programs need), except for names the user listed in
/// `--container-env`, where the job's wins. Slurm's and Drover's own variables are never the image's to change.
pub fn merge_environment(task: &[(String, String)], image: &[String], keep: &[String]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = task.to_vec();
    for entry in image {
        let Some((name, value)) = entry.split_once('=') else { continue };
        let ours = name.starts_with("SLURM_") || name.starts_with("DROVER_") || keep.iter().any(|k| k == name);
        if ours && env.iter().any(|(n, _)| n == name) {
            continue;
        }
        match env.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value.to_string(),
            None => env.push((name.to_string(), value.to_string())),
        }
    }
    env
}

/// Which of the node's GPUs a container task holds, by the node's indices (`CUDA_VISIBLE_DEVICES` inside counts
/// from 0).
pub const NODE_GPUS_VAR: &str = "DROVER_NODE_GPUS";

/// A container sees only its own GPUs' device nodes, so CUDA (and NVML) number them from 0 there, as in a
/// Slurm step whose devices are confined: `CUDA_VISIBLE_DEVICES=3,5` becomes `0,1`, and the node's indices stay in
/// [`NODE_GPUS_VAR`].
fn renumber_gpus(env: &mut Vec<(String, String)>) {
    let Some(slot) = env.iter_mut().find(|(name, _)| name == "CUDA_VISIBLE_DEVICES") else { return };
    let node = std::mem::take(&mut slot.1);
    let count = node.split(',').filter(|s| !s.is_empty()).count();
    slot.1 = (0..count).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    env.retain(|(name, _)| name != NODE_GPUS_VAR);
    env.push((NODE_GPUS_VAR.to_string(), node));
}

/// The entries of `proc_gpus` (`/proc/driver/nvidia/gpus`, one directory per GPU by PCI address) that are not one
/// of `held` (NVML's bus ids, `00000000:18:00.0`; the kernel writes `0000:18:00.0`).
pub fn hidden_gpu_entries(proc_gpus: &Path, held: &[&str]) -> Vec<String> {
    let normal = |id: &str| {
        let id = id.to_ascii_lowercase();
        let (domain, rest) = id.split_once(':').unwrap_or(("0", id.as_str()));
        format!("{:x}:{rest}", u64::from_str_radix(domain, 16).unwrap_or(0))
    };
    let held: Vec<String> = held.iter().map(|id| normal(id)).collect();
    let Ok(entries) = fs::read_dir(proc_gpus) else { return Vec::new() };
    let mut hidden: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| !held.contains(&normal(name)))
        .collect();
    hidden.sort();
    hidden
}

/// The user's home directory from the node's user database.
pub fn home_of(uid: u32) -> Option<String> {
    crate::env::passwd_entry(uid).map(|(_, home, _)| home)
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().create(true).write(true).truncate(true).mode(0o644).open(path)?;
    file.write_all(bytes)
}

fn cstring(text: &str) -> CString {
    // Paths come from checked specs (no NUL: `ContainerSpec::validate`) or from the agent itself.
    CString::new(text.replace('\0', "")).expect("NUL removed")
}

fn cstring_path(path: &Path) -> CString {
    cstring(&path.display().to_string())
}

/// Stage bytes the child writes before each container step, for the error of the step that failed: op `i` is
/// `STAGE_CONTAINER_OPS + i` (fewer than 100 ops: a plan has a dozen plus the user's mounts, at most 64).
pub const STAGE_CONTAINER_OPS: u8 = 100;
pub const STAGE_CONTAINER_NAMESPACE: u8 = 20;
pub const STAGE_CONTAINER_PIVOT: u8 = 21;
pub const STAGE_CONTAINER_USERNS: u8 = 22;
pub const STAGE_CONTAINER_CWD: u8 = 23;
pub const STAGE_CONTAINER_NO_NEW_PRIVS: u8 = 24;
/// Hook `i` is `STAGE_CONTAINER_HOOKS + i` (at most `crate::cdi::MAX_HOOKS`).
pub const STAGE_CONTAINER_HOOKS: u8 = 40;

/// Runs in the task's process between fork and exec, as root: a mount namespace of its own, the plan's mounts,
/// pivot_root into the container. Async-signal-safe calls on data prepared before the fork; no allocation.
///
/// # Safety
/// Call only in the child between fork and exec.
pub unsafe fn enter(plan: &Plan, mark: &dyn Fn(u8)) -> io::Result<()> {
    let check = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    mark(STAGE_CONTAINER_NAMESPACE);
    // SAFETY (all calls below): syscalls on C strings that outlive them.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Nothing mounted from here on reaches the host, and nothing the host mounts later reaches the task.
        check(libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        for (i, op) in plan.ops.iter().enumerate() {
            mark(STAGE_CONTAINER_OPS.saturating_add(i.min(150) as u8));
            match op {
                MountOp::Mount { source, target, fstype, flags, data } => {
                    check(libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        fstype.as_ptr(),
                        *flags,
                        data.as_ptr().cast(),
                    ))?;
                }
                MountOp::Bind { source, target, recursive, flags } => {
                    let rec = if *recursive { libc::MS_REC } else { 0 };
                    check(libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | rec,
                        std::ptr::null(),
                    ))?;
                    remount_bind(target, *flags)?;
                }
                MountOp::Umount { target } => check(libc::umount2(target.as_ptr(), libc::MNT_DETACH))?,
                MountOp::Attach { tree, target, flags } => {
                    check(libc::syscall(
                        libc::SYS_move_mount,
                        *tree,
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        target.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ) as libc::c_int)?;
                    remount_bind(target, *flags)?;
                }
                MountOp::Mkdir { path, mode } => {
                    if libc::mkdir(path.as_ptr(), *mode) != 0 && *libc::__errno_location() != libc::EEXIST {
                        return Err(io::Error::last_os_error());
                    }
                }
                MountOp::Touch { path } => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                MountOp::Symlink { target, link } => {
                    if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 && *libc::__errno_location() != libc::EEXIST {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
        }
        for (i, hook) in plan.hooks.iter().enumerate() {
            mark(STAGE_CONTAINER_HOOKS.saturating_add(i.min(crate::cdi::MAX_HOOKS) as u8));
            run_hook(hook, &plan.hook_state, plan.pid_at)?;
        }
        mark(STAGE_CONTAINER_PIVOT);
        check(libc::chdir(plan.rootfs.as_ptr()))?;
        // pivot_root(".", "."): the old root ends up on top of the new one, and is detached at once.
        check(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int)?;
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
        check(libc::chdir(c"/".as_ptr()))?;
    }
    Ok(())
}

/// `move_mount` from the descriptor itself (libc does not name the flag).
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// A bind mount's flags (read-only, nosuid, ...), which it takes only on a remount; nothing when there are none.
/// Async-signal-safe: runs in the child.
fn remount_bind(target: &CString, flags: libc::c_ulong) -> io::Result<()> {
    if flags == 0 {
        return Ok(());
    }
    // SAFETY: mount on a C string that outlives the call.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Runs one hook from the child (still root, in the container's mount namespace before pivot_root): the OCI state,
/// with this process's pid, on its stdin; its output goes where the task's does. Stack buffers only.
///
/// # Safety
/// Call only in the child between fork and exec.
unsafe fn run_hook(hook: &HookRun, state: &[u8], pid_at: usize) -> io::Result<()> {
    let mut buf = [0u8; MAX_HOOK_STATE];
    let len = state.len().min(MAX_HOOK_STATE);
    buf[..len].copy_from_slice(&state[..len]);
    // SAFETY (this block): syscalls on stack buffers and on C strings that outlive them.
    unsafe {
        let pid = digits(libc::getpid() as u32);
        for (i, &d) in pid.iter().take_while(|&&d| d != 0).enumerate() {
            if pid_at + i < len {
                buf[pid_at + i] = d;
            }
        }
        let mut argv = [std::ptr::null::<libc::c_char>(); crate::cdi::MAX_HOOK_WORDS + 1];
        for (slot, word) in argv.iter_mut().zip(hook.argv.iter().take(crate::cdi::MAX_HOOK_WORDS)) {
            *slot = word.as_ptr();
        }
        let mut envp = [std::ptr::null::<libc::c_char>(); crate::cdi::MAX_HOOK_WORDS + 1];
        for (slot, word) in envp.iter_mut().zip(hook.env.iter().take(crate::cdi::MAX_HOOK_WORDS)) {
            *slot = word.as_ptr();
        }
        let mut fds = [0 as libc::c_int; 2];
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        // A pipe holds 64 KiB: the state (at most 4 KiB) is written whole before the hook starts.
        libc::write(fds[1], buf.as_ptr().cast(), len);
        libc::close(fds[1]);
        let child = libc::fork();
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        if child == 0 {
            libc::dup2(fds[0], 0);
            libc::execve(hook.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(127);
        }
        libc::close(fds[0]);
        let mut status = 0;
        if libc::waitpid(child, &mut status, 0) != child {
            return Err(io::Error::last_os_error());
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(io::Error::from_raw_os_error(if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 127 {
                libc::ENOEXEC
            } else {
                libc::EIO
            }));
        }
    }
    Ok(())
}

/// `--container-remap-root`, in the child after [`enter`] and with the user's supplementary groups already set:
/// a user namespace whose root is the job's user outside. The maps must be written by a process with privilege in
/// the parent namespace, so a short-lived helper forked from here (still root there) writes them.
///
/// # Safety
/// Call only in the child between fork and exec.
pub unsafe fn remap_root(uid: u32, gid: u32, mark: &dyn Fn(u8)) -> io::Result<()> {
    mark(STAGE_CONTAINER_USERNS);
    let check = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY (all calls below): syscalls on stack buffers that outlive them; the helper only writes files and exits.
    unsafe {
        check(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
        let helper = libc::fork();
        if helper < 0 {
            return Err(io::Error::last_os_error());
        }
        if helper == 0 {
            let mut byte = 0u8;
            libc::close(fds[1]);
            if libc::read(fds[0], (&mut byte as *mut u8).cast(), 1) != 1 {
                libc::_exit(1);
            }
            let parent = libc::getppid() as u32;
            let ok = write_map(parent, b"uid_map", uid) && write_map(parent, b"gid_map", gid);
            libc::_exit(if ok { 0 } else { 1 });
        }
        libc::close(fds[0]);
        let unshared = libc::unshare(libc::CLONE_NEWUSER);
        let error = io::Error::last_os_error();
        // Wake the helper either way, so it never waits for ever.
        let byte = 1u8;
        libc::write(fds[1], (&byte as *const u8).cast(), 1);
        libc::close(fds[1]);
        let mut status = 0;
        libc::waitpid(helper, &mut status, 0);
        if unshared != 0 {
            return Err(error);
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        check(libc::setresgid(0, 0, 0))?;
        check(libc::setresuid(0, 0, 0))?;
    }
    Ok(())
}

/// Writes `0 ID 1` to `/proc/PID/NAME`, with stack buffers only (the helper runs in a forked child).
fn write_map(pid: u32, name: &[u8], id: u32) -> bool {
    let mut path = [0u8; 64];
    let mut n = 0;
    for part in [b"/proc/".as_slice(), digits(pid).as_slice()] {
        for &b in part.iter().filter(|&&b| b != 0) {
            path[n] = b;
            n += 1;
        }
    }
    path[n] = b'/';
    n += 1;
    for &b in name {
        path[n] = b;
        n += 1;
    }
    let mut line = [0u8; 32];
    let mut m = 0;
    for part in [b"0 ".as_slice(), digits(id).as_slice(), b" 1\n".as_slice()] {
        for &b in part.iter().filter(|&&b| b != 0) {
            line[m] = b;
            m += 1;
        }
    }
    // SAFETY: path is NUL-terminated (zeroed buffer, at most 40 bytes written); line holds m bytes.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let written = libc::write(fd, line.as_ptr().cast(), m);
        libc::close(fd);
        written == m as isize
    }
}

/// The decimal digits of `n`, left-aligned, the rest NUL.
fn digits(mut n: u32) -> [u8; 10] {
    let mut reversed = [0u8; 10];
    let mut len = 0;
    loop {
        reversed[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut out = [0u8; 10];
    for i in 0..len {
        out[i] = reversed[len - 1 - i];
    }
    out
}

/// `--container-save`: the container's filesystem as it is now, written to `path` as a squashfs file. mksquashfs
/// reads the rootfs as root into the container's own directory; the result is then copied into a file the user
/// opened (`create_as_user`), so the user can only write where they may.
pub fn save(
    rootfs: &Path,
    dir: &Path,
    path: &str,
    create_as_user: &dyn Fn(&str) -> io::Result<File>,
) -> io::Result<()> {
    let staged = dir.join("save.sqsh");
    let _ = fs::remove_file(&staged);
    let status = std::process::Command::new("mksquashfs")
        .arg(rootfs)
        .arg(&staged)
        // Root's, as an image's files are (the user's own files show as theirs through the idmapping again).
        .args(["-noappend", "-quiet", "-no-progress", "-no-xattrs", "-all-root"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!("mksquashfs failed ({status})")));
    }
    let mut from = File::open(&staged)?;
    let mut to = create_as_user(path)?;
    io::copy(&mut from, &mut to)?;
    to.sync_all()?;
    fs::remove_file(&staged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn the_image_sets_its_own_paths_but_never_slurms_variables() {
        let task = env(&[("PATH", "/host/bin"), ("SLURM_JOB_ID", "7"), ("HF_HOME", "/data/hf"), ("LANG", "C")]);
        let image: Vec<String> =
            ["PATH=/opt/conda/bin:/usr/bin", "SLURM_JOB_ID=0", "HF_HOME=/root/hf", "CUDA_HOME=/usr/local/cuda"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let merged = merge_environment(&task, &image, &["HF_HOME".to_string()]);
        let get = |name: &str| merged.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/opt/conda/bin:/usr/bin"), "the image's programs come first");
        assert_eq!(get("SLURM_JOB_ID"), Some("7"));
        assert_eq!(get("HF_HOME"), Some("/data/hf"), "--container-env keeps the job's value");
        assert_eq!(get("CUDA_HOME"), Some("/usr/local/cuda"));
        assert_eq!(get("LANG"), Some("C"));
    }

    #[test]
    fn the_users_identity_is_added_to_the_images_and_a_symlinked_etc_is_not_read() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("etc")).unwrap();
        fs::write(root.path().join("etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let (passwd, group) = identity_files(root.path(), 1234, 1234, "alice", Some("/home/alice"), false);
        assert!(passwd.starts_with("root:x:0:0"));
        assert!(passwd.contains("alice:x:1234:1234::/home/alice:/bin/sh\n"), "{passwd}");
        assert_eq!(group, "alice:x:1234:\n");
        let (remapped, _) = identity_files(root.path(), 1234, 1234, "alice", None, true);
        assert!(!remapped.contains("alice"), "root inside is the image's root");

        let hostile = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", hostile.path().join("etc")).unwrap();
        let (passwd, _) = identity_files(hostile.path(), 1234, 1234, "alice", None, false);
        assert_eq!(passwd, "alice:x:1234:1234::/:/bin/sh\n", "nothing of the host's files");
    }

    #[test]
    fn a_mount_destination_through_a_symlink_in_the_image_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("data")).unwrap();
        let builder = PlanBuilder {
            rootfs: root.path(),
            writable: true,
            ops: Vec::new(),
            descriptions: Vec::new(),
            held: Vec::new(),
        };
        let refused = builder.target("/data/x", false).unwrap_err();
        assert!(refused.to_string().contains("symbolic link"), "{refused}");
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("hosts")).unwrap();
        assert!(builder.target("/hosts", true).unwrap_err().to_string().contains("symbolic link"), "a file too");
        builder.target("/scratch/deep", false).unwrap();
        builder.target("/scratch/file", true).unwrap();
        assert!(root.path().join("scratch/file").is_file());
        assert!(root.path().join("scratch/deep").is_dir(), "missing mount points are made in a writable container");
        let readonly = PlanBuilder {
            rootfs: root.path(),
            writable: false,
            ops: Vec::new(),
            descriptions: Vec::new(),
            held: Vec::new(),
        };
        assert!(readonly.target("/other", false).unwrap_err().to_string().contains("--container-writable"));
    }

    #[test]
    fn the_driver_entries_of_other_gpus_are_hidden_whatever_the_domains_spelling() {
        let proc_gpus = tempfile::tempdir().unwrap();
        for bus in ["0000:18:00.0", "0000:2a:00.0", "0000:3B:00.0"] {
            fs::create_dir(proc_gpus.path().join(bus)).unwrap();
        }
        let hidden = hidden_gpu_entries(proc_gpus.path(), &["00000000:2A:00.0"]);
        assert_eq!(hidden, ["0000:18:00.0", "0000:3B:00.0"]);
        assert!(hidden_gpu_entries(&proc_gpus.path().join("none"), &[]).is_empty(), "no driver, nothing to hide");
    }

    #[test]
    fn removing_a_jobs_containers_never_deletes_through_a_mount_into_the_image() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return eprintln!("SKIPPED: mounting needs root");
        }
        let store = tempfile::tempdir().unwrap();
        fs::write(store.path().join("precious"), "the shared image").unwrap();
        let job = tempfile::tempdir().unwrap();
        let container = job.path().join("containers").join("7.0").join("step-0");
        for sub in ["lower", "rootfs", "layer/upper/etc"] {
            fs::create_dir_all(container.join(sub)).unwrap();
        }
        fs::write(container.join("layer/upper/etc/mine"), "x").unwrap();
        fs::write(container.join("state.json"), "{}").unwrap();
        let (source, target) = (cstring_path(store.path()), cstring_path(&container.join("lower")));
        // SAFETY: valid C strings; a bind mount like the idmapped clone of an image.
        let rc =
            unsafe { libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        remove_job_containers(&job.path().join("containers").join("7.0")).unwrap();
        assert!(!job.path().join("containers/7.0").exists());
        assert_eq!(fs::read_to_string(store.path().join("precious")).unwrap(), "the shared image");
    }

    #[test]
    fn digits_for_the_helpers_paths() {
        assert_eq!(&digits(0)[..1], b"0");
        assert_eq!(&digits(4_294_967_295)[..10], b"4294967295");
        assert_eq!(&digits(1234)[..5], b"1234\0");
    }
}

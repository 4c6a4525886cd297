//! GPUs in containers through the Container Device Interface (CDI): the spec the NVIDIA Container Toolkit writes
//! (`nvidia-ctk cdi generate`, usually `/etc/cdi/nvidia.yaml` or `/var/run/cdi/nvidia.yaml`) says, per GPU and for
//! all of them, which device nodes, mounts (the driver's libraries and binaries) and variables a container needs.
//! A job's container gets the edits of the GPUs it holds on the node and those common to all, and nothing of the
//! other GPUs.
//!
//! Simulated nodes write a spec of their own whose device nodes are stand-ins (character devices like
//! `/dev/null`, under the agent's state directory), so tests see exactly which GPUs a container was given.
//!
//! Hooks that OCI runtimes run once the container's mounts are made and before it switches root (`prestart`,
//! `createRuntime`, `createContainer`: nvidia-ctk's `update-ldcache` and `create-symlinks`) run at that point too,
//! as root, with the OCI state on their stdin and a `config.json` naming the container's root in its bundle
//! directory (see `crate::container`). Hooks of later points (`startContainer`, `poststart`, `poststop`) are
//! counted and not run.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest spec read: NVIDIA's lists a few hundred mounts, well under a MiB.
const MAX_SPEC_BYTES: u64 = 4 << 20;

/// What a container gets for its GPUs, ready for the supervisor (host paths and paths inside).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdiEdits {
    /// `(host path, path inside)`.
    pub device_nodes: Vec<(String, String)>,
    /// `(host path, path inside, read-only)`.
    pub mounts: Vec<(String, String, bool)>,
    pub env: Vec<(String, String)>,
    /// Hooks to run once the mounts are made, before the task switches root, in the spec's order.
    #[serde(default)]
    pub hooks: Vec<CdiHook>,
    /// Hooks of later points, which Drover does not run.
    pub hooks_skipped: usize,
}

/// One OCI hook from a CDI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdiHook {
    /// Absolute path on the node.
    pub path: String,
    /// `argv`, the program's name first (empty: the path alone).
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
}

/// Most hooks one container runs, and most words in one hook's argv or environment: NVIDIA's specs have a handful.
pub const MAX_HOOKS: usize = 16;
pub const MAX_HOOK_WORDS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("cannot read the CDI spec {path}: {cause}")]
    Read { path: PathBuf, cause: io::Error },
    #[error("the CDI spec {path} is invalid: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error(
        "the CDI spec {path} has no device named `{name}` (the GPU this job holds); regenerate it with nvidia-ctk cdi generate"
    )]
    NoDevice { path: PathBuf, name: String },
}

/// A parsed spec (YAML or JSON: JSON is YAML).
#[derive(Debug, Clone)]
pub struct CdiSpec {
    path: PathBuf,
    spec: Spec,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Spec {
    #[serde(rename = "cdiVersion")]
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(rename = "containerEdits", default)]
    edits: Edits,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Device {
    name: String,
    #[serde(rename = "containerEdits", default)]
    edits: Edits,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
struct Edits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(rename = "deviceNodes", default, skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hooks: Vec<Hook>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Hook {
    #[serde(rename = "hookName")]
    hook_name: String,
    path: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct DeviceNode {
    path: String,
    #[serde(rename = "hostPath", default, skip_serializing_if = "Option::is_none")]
    host_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Mount {
    #[serde(rename = "hostPath")]
    host_path: String,
    #[serde(rename = "containerPath")]
    container_path: String,
    #[serde(default)]
    options: Vec<String>,
}

impl CdiSpec {
    pub fn load(path: &Path) -> Result<CdiSpec, CdiError> {
        let read = |cause| CdiError::Read { path: path.to_path_buf(), cause };
        let size = fs::metadata(path).map_err(read)?.len();
        if size > MAX_SPEC_BYTES {
            let why = format!("{size} bytes, over the {MAX_SPEC_BYTES}-byte limit");
            return Err(CdiError::Invalid { path: path.to_path_buf(), why });
        }
        let text = fs::read_to_string(path).map_err(read)?;
        let spec: Spec = serde_yaml::from_str(&text)
            .map_err(|e| CdiError::Invalid { path: path.to_path_buf(), why: e.to_string() })?;
        let absolute = |p: &str| p.starts_with('/') && !p.contains('\0');
        let all = spec.edits.device_nodes.iter().chain(spec.devices.iter().flat_map(|d| &d.edits.device_nodes));
        for node in all {
            if !absolute(&node.path) || node.host_path.as_deref().is_some_and(|p| !absolute(p)) {
                let why = format!("device node {} is not an absolute path", node.path);
                return Err(CdiError::Invalid { path: path.to_path_buf(), why });
            }
        }
        let hooks: Vec<&Hook> =
            spec.edits.hooks.iter().chain(spec.devices.iter().flat_map(|d| &d.edits.hooks)).collect();
        for hook in &hooks {
            let words = hook.args.iter().chain(&hook.env);
            if !absolute(&hook.path)
                || hook.args.len() > MAX_HOOK_WORDS
                || hook.env.len() > MAX_HOOK_WORDS
                || words.clone().any(|w| w.contains('\0'))
            {
                let why = format!("hook {} is not an absolute path with at most {MAX_HOOK_WORDS} words", hook.path);
                return Err(CdiError::Invalid { path: path.to_path_buf(), why });
            }
        }
        if hooks.len() > MAX_HOOKS {
            let why = format!("{} hooks, over the limit of {MAX_HOOKS}", hooks.len());
            return Err(CdiError::Invalid { path: path.to_path_buf(), why });
        }
        for m in spec.edits.mounts.iter().chain(spec.devices.iter().flat_map(|d| &d.edits.mounts)) {
            if !absolute(&m.host_path) || !absolute(&m.container_path) {
                let why = format!("mount {} -> {} is not between absolute paths", m.host_path, m.container_path);
                return Err(CdiError::Invalid { path: path.to_path_buf(), why });
            }
        }
        Ok(CdiSpec { path: path.to_path_buf(), spec })
    }

    /// The edits for a container holding these GPUs (by index, CDI's device names `0`, `1`, ...): the spec's common
    /// edits and each GPU's own.
    pub fn edits_for(&self, gpus: &[u32]) -> Result<CdiEdits, CdiError> {
        let mut chosen = vec![&self.spec.edits];
        for gpu in gpus {
            let name = gpu.to_string();
            let device = self.spec.devices.iter().find(|d| d.name == name);
            let device = device.ok_or_else(|| CdiError::NoDevice { path: self.path.clone(), name })?;
            chosen.push(&device.edits);
        }
        let mut edits = CdiEdits::default();
        let mut seen = BTreeSet::new();
        for e in chosen {
            for node in &e.device_nodes {
                if seen.insert(node.path.clone()) {
                    let host = node.host_path.clone().unwrap_or_else(|| node.path.clone());
                    edits.device_nodes.push((host, node.path.clone()));
                }
            }
            for m in &e.mounts {
                let readonly = m.options.iter().any(|o| o == "ro");
                edits.mounts.push((m.host_path.clone(), m.container_path.clone(), readonly));
            }
            for entry in &e.env {
                if let Some((name, value)) = entry.split_once('=') {
                    edits.env.retain(|(n, _)| n != name);
                    edits.env.push((name.to_string(), value.to_string()));
                }
            }
            for hook in &e.hooks {
                match hook.hook_name.as_str() {
                    "prestart" | "createRuntime" | "createContainer" => edits.hooks.push(CdiHook {
                        path: hook.path.clone(),
                        args: hook.args.clone(),
                        env: hook.env.clone(),
                    }),
                    _ => edits.hooks_skipped += 1,
                }
            }
        }
        Ok(edits)
    }
}

/// Where a node finds its CDI spec when its config names none: NVIDIA's usual places.
pub fn default_spec() -> Option<PathBuf> {
    ["/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Writes a CDI spec for `count` simulated GPUs under `dir` (`dir/dev/nvidiaN` stand-ins for the device nodes,
/// `dir/simulated.json`), and returns its path.
pub fn write_simulated(dir: &Path, count: u32) -> io::Result<PathBuf> {
    let dev = dir.join("dev");
    fs::create_dir_all(&dev)?;
    let node = |name: &str| -> io::Result<String> {
        let path = dev.join(name);
        if fs::symlink_metadata(&path).is_err() {
            make_stand_in(&path)?;
        }
        Ok(path.display().to_string())
    };
    let mut devices = Vec::new();
    for i in 0..count {
        let host = node(&format!("nvidia{i}"))?;
        let edits = Edits {
            device_nodes: vec![DeviceNode { path: format!("/dev/nvidia{i}"), host_path: Some(host) }],
            ..Edits::default()
        };
        devices.push(Device { name: i.to_string(), edits });
    }
    let common = Edits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: vec![DeviceNode { path: "/dev/nvidiactl".into(), host_path: Some(node("nvidiactl")?) }],
        ..Edits::default()
    };
    let spec = Spec { cdi_version: "0.5.0".into(), kind: "nvidia.com/gpu".into(), devices, edits: common };
    let path = dir.join("simulated.json");
    fs::write(&path, serde_json::to_vec_pretty(&spec).expect("serializable"))?;
    Ok(path)
}

/// A character device like `/dev/null` (1:3), which a task can open and write as it would a GPU's node; a plain
/// empty file where the agent may not make devices (not root).
fn make_stand_in(path: &Path) -> io::Result<()> {
    let c_path = std::ffi::CString::new(path.display().to_string()).map_err(io::Error::other)?;
    // SAFETY: a valid C string; mknod has no other preconditions.
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    if rc != 0 {
        fs::write(path, b"")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA: &str = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
"#;

    #[test]
    fn a_container_gets_its_own_gpus_nodes_and_the_common_edits_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia.yaml");
        fs::write(&path, NVIDIA).unwrap();
        let spec = CdiSpec::load(&path).unwrap();
        let edits = spec.edits_for(&[1]).unwrap();
        let inside: Vec<&str> = edits.device_nodes.iter().map(|(_, i)| i.as_str()).collect();
        assert_eq!(inside, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]);
        assert_eq!(edits.mounts.len(), 1);
        assert!(edits.mounts[0].2, "read-only as the spec says");
        assert_eq!(edits.env, [("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string())]);
        assert_eq!(edits.hooks.len(), 1, "a createContainer hook is run");
        assert_eq!(edits.hooks[0].args, ["nvidia-ctk", "hook", "update-ldcache"]);
        let missing = spec.edits_for(&[7]).unwrap_err();
        assert!(missing.to_string().contains("no device named `7`"), "{missing}");
    }

    #[test]
    fn a_simulated_node_writes_a_spec_of_stand_in_devices() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_simulated(dir.path(), 2).unwrap();
        let edits = CdiSpec::load(&path).unwrap().edits_for(&[0]).unwrap();
        let host = &edits.device_nodes.iter().find(|(_, inside)| inside == "/dev/nvidia0").unwrap().0;
        assert!(fs::symlink_metadata(host).is_ok());
        assert!(!edits.device_nodes.iter().any(|(_, inside)| inside == "/dev/nvidia1"));
        assert_eq!(write_simulated(dir.path(), 2).unwrap(), path, "written again over the same files");
    }

    #[test]
    fn a_spec_with_relative_paths_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        fs::write(&path, "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    deviceNodes:\n    - path: dev/nvidia0\n").unwrap();
        assert!(CdiSpec::load(&path).unwrap_err().to_string().contains("absolute"));
    }
}

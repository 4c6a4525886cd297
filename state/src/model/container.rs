//! Containers, as NVIDIA's pyxis plugin spells them for Slurm (`--container-image`, `--container-mounts`, ...): what
//! a job or an srun step asks for, parsed and checked where the user types it, so the agent gets a request it can
//! carry out or the user gets an error naming the problem before anything is queued.

use serde::{Deserialize, Serialize};

/// Longest image reference, mount list entry or path accepted: a reference is at most a few hundred bytes.
pub const MAX_CONTAINER_TEXT: usize = 4096;
/// Most bind mounts one container may ask for.
pub const MAX_CONTAINER_MOUNTS: usize = 64;
/// Most `--container-env` names.
pub const MAX_CONTAINER_ENV: usize = 256;

/// A job's or a step's container: pyxis's options, typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ContainerSpec {
    /// `--container-image`: `None` when only `--container-name` names a container an earlier step of the job made.
    pub image: Option<ImageRef>,
    /// `--container-mounts=SRC:DST[:FLAGS][,...]`.
    pub mounts: Vec<ContainerMount>,
    /// `--container-workdir`: the task's working directory inside; `None`: the image's own (pyxis's default).
    pub workdir: Option<String>,
    /// `--container-name`: a container that later steps of the same job on the same node reuse, writable layer
    /// and all.
    pub name: Option<String>,
    /// `--container-readonly` (the default, as pyxis's, is a writable container whose changes are the job's own).
    pub readonly: bool,
    /// `--container-mount-home`: the user's home directory, mounted at the same path.
    pub mount_home: bool,
    /// `--container-remap-root`: the task runs as root inside a user namespace, still the job's user outside.
    pub remap_root: bool,
    /// `--container-entrypoint`: the image's entrypoint runs first, with the task's command as its arguments.
    pub entrypoint: bool,
    /// `--container-env=NAME,...`: variables whose value from the job wins over the image's.
    pub env: Vec<String>,
    /// `--container-save=PATH`: the container's filesystem is saved there (a squashfs file) when the task ends.
    pub save: Option<String>,
    /// The image's digest as the job's first incarnation ran it (recorded from the node, not given by the user):
    /// a requeued job restarts in the same image even if its tag has moved since.
    pub pinned_digest: Option<String>,
}

/// One `--container-mounts` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMount {
    pub source: MountSource,
    /// Absolute path inside the container.
    pub target: String,
    /// `ro`: read-only inside.
    pub readonly: bool,
    /// `bind` rather than the default `rbind`: mounts below the source are not carried along.
    pub non_recursive: bool,
    /// `nosuid`, `nodev`, `noexec`, as in fstab.
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountSource {
    /// An absolute path on the node.
    Path(String),
    /// `tmpfs`: an empty memory-backed directory.
    Tmpfs,
    /// `umount`: whatever is mounted at the target inside is taken away.
    Umount,
}

/// Where an image comes from: a registry (enroot's `[USER@][REGISTRY#]IMAGE[:TAG]`, or docker's
/// `REGISTRY/IMAGE[:TAG]`) or a file on the node (a squashfs file, a docker or OCI archive).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ImageRef {
    Registry(RegistryImage),
    /// An absolute path on the node (the client resolves `./x.sqsh` against its working directory).
    File(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegistryImage {
    /// `USER@`: whose credentials to use for the registry (the job's user's own files decide the secret).
    pub user: Option<String>,
    /// `nvcr.io`, `127.0.0.1:5000`; Docker Hub is `docker.io`.
    pub registry: String,
    /// `nvidia/pytorch`; Docker Hub's official images are `library/NAME`.
    pub repository: String,
    pub reference: ImageTag,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ImageTag {
    Tag(String),
    /// `sha256:` and 64 hex digits.
    Digest(String),
}

/// Docker Hub, where a reference without a registry points (as docker's and enroot's do).
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// Why a container option cannot be used; the text names the value and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainerError {
    #[error(
        "invalid image reference `{text}`: {why} (expected [USER@][REGISTRY#]IMAGE[:TAG], REGISTRY/IMAGE[:TAG] or a path starting with / or ./)"
    )]
    Image { text: String, why: &'static str },
    #[error(
        "invalid --container-mounts entry `{text}`: {why} (expected SRC[:DST[:FLAGS]], FLAGS joined by + from ro, rw, bind, rbind, private, rprivate, nosuid, nodev, noexec)"
    )]
    Mount { text: String, why: String },
    #[error("invalid --container-{option} `{text}`: {why}")]
    Value { option: &'static str, text: String, why: &'static str },
}

impl ImageRef {
    /// Parses what `--container-image` was given. A path must already be absolute here (the client resolves a
    /// relative one first, see [`ImageRef::parse_in`]).
    pub fn parse(text: &str) -> Result<ImageRef, ContainerError> {
        let bad = |why| ContainerError::Image { text: text.to_string(), why };
        if text.is_empty() {
            return Err(bad("it is empty"));
        }
        if text.len() > MAX_CONTAINER_TEXT {
            return Err(bad("it is too long"));
        }
        if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("it holds a space or a control character"));
        }
        if text.starts_with('/') {
            return Ok(ImageRef::File(text.to_string()));
        }
        if text.starts_with("./") || text.starts_with("../") {
            return Err(bad("a relative path must be resolved against the working directory first"));
        }
        let rest = text.strip_prefix("docker://").unwrap_or(text);
        // `USER@` comes first; an `@` after the image's name is a digest (`ubuntu@sha256:...`).
        let (user, rest) = match rest.split_once('@') {
            Some((user, after)) if !user.contains(['/', ':', '#']) && !after.starts_with("sha256:") => {
                if user.is_empty() {
                    return Err(bad("the user before @ is empty"));
                }
                (Some(user.to_string()), after)
            }
            _ => (None, rest),
        };
        let (registry, path) = match rest.split_once('#') {
            Some((registry, path)) => {
                if registry.is_empty() {
                    return Err(bad("the registry before # is empty"));
                }
                (registry.to_string(), path)
            }
            None => match rest.split_once('/') {
                // Docker's rule: a first component with a dot or a port, or `localhost`, is a registry.
                Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => (first.to_string(), path),
                _ => (DEFAULT_REGISTRY.to_string(), rest),
            },
        };
        if !registry.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c)) {
            return Err(bad("the registry is not a host name with an optional port"));
        }
        let (name, reference) = match path.split_once('@') {
            Some((name, digest)) => {
                let hex = digest.strip_prefix("sha256:").unwrap_or("");
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) {
                    return Err(bad("a digest is sha256: and 64 lower-case hex digits"));
                }
                (name, ImageTag::Digest(digest.to_string()))
            }
            None => {
                let last_slash = path.rfind('/').map_or(0, |i| i + 1);
                match path[last_slash..].rfind(':') {
                    Some(colon) => {
                        let tag = &path[last_slash + colon + 1..];
                        let tag_ok = tag.len() <= 128
                            && tag.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                            && tag.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
                        if !tag_ok {
                            return Err(bad("a tag is 1 to 128 letters, digits, _ . or -"));
                        }
                        (&path[..last_slash + colon], ImageTag::Tag(tag.to_string()))
                    }
                    None => (path, ImageTag::Tag("latest".to_string())),
                }
            }
        };
        if name.is_empty() {
            return Err(bad("the image name is empty"));
        }
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
                && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        };
        if !name.split('/').all(component_ok) {
            return Err(bad("an image name is lower-case letters, digits, . _ - and / between components"));
        }
        let repository = if registry == DEFAULT_REGISTRY && !name.contains('/') {
            format!("library/{name}")
        } else {
            name.to_string()
        };
        Ok(ImageRef::Registry(RegistryImage { user, registry, repository, reference }))
    }

    /// As [`ImageRef::parse`], with `./x` and `../x` resolved against `cwd` (the client's working directory).
    pub fn parse_in(text: &str, cwd: &str) -> Result<ImageRef, ContainerError> {
        if text.starts_with("./") || text.starts_with("../") {
            return ImageRef::parse(&join(cwd, text));
        }
        ImageRef::parse(text)
    }
}

/// `cwd/relative`, with `.` and `..` components folded (purely textual: the path is on another machine).
fn join(cwd: &str, relative: &str) -> String {
    let mut parts: Vec<&str> = cwd.split('/').filter(|p| !p.is_empty()).collect();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

impl std::fmt::Display for ImageRef {
    /// Enroot's spelling, which `--container-image` accepts back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageRef::File(path) => f.write_str(path),
            ImageRef::Registry(r) => {
                if let Some(user) = &r.user {
                    write!(f, "{user}@")?;
                }
                write!(f, "{}#{}", r.registry, r.repository)?;
                match &r.reference {
                    ImageTag::Tag(tag) => write!(f, ":{tag}"),
                    ImageTag::Digest(digest) => write!(f, "@{digest}"),
                }
            }
        }
    }
}

impl ContainerMount {
    /// One entry of `--container-mounts` (the list is split at commas by [`ContainerMount::parse_list`]).
    pub fn parse(text: &str, cwd: &str) -> Result<ContainerMount, ContainerError> {
        let bad = |why: &str| ContainerError::Mount { text: text.to_string(), why: why.to_string() };
        let mut fields = text.split(':');
        let source = fields.next().unwrap_or("");
        let target = fields.next();
        let flags = fields.next();
        if fields.next().is_some() {
            return Err(bad("more than three fields separated by :"));
        }
        let source = match source {
            "" => return Err(bad("the source is empty")),
            "tmpfs" => MountSource::Tmpfs,
            "umount" => MountSource::Umount,
            s if s.starts_with('/') => MountSource::Path(join("/", s)),
            s => MountSource::Path(join(cwd, s)),
        };
        let target = match (target, &source) {
            (Some(t), _) if t.starts_with('/') => join("/", t),
            (Some(""), _) | (None, MountSource::Tmpfs | MountSource::Umount) => {
                return Err(bad("the destination inside the container is missing"));
            }
            (Some(_), _) => return Err(bad("the destination inside the container must be an absolute path")),
            (None, MountSource::Path(p)) => p.clone(),
        };
        if target == "/" {
            return Err(bad("the container's root cannot be a mount destination"));
        }
        let mut mount = ContainerMount {
            source,
            target,
            readonly: false,
            non_recursive: false,
            nosuid: false,
            nodev: false,
            noexec: false,
        };
        for flag in flags.into_iter().flat_map(|f| f.split('+')) {
            match flag {
                "ro" => mount.readonly = true,
                "rw" => mount.readonly = false,
                "bind" => mount.non_recursive = true,
                "rbind" => mount.non_recursive = false,
                // Every mount a container gets is private to it: the only propagation Drover offers.
                "private" | "rprivate" => {}
                "nosuid" => mount.nosuid = true,
                "nodev" => mount.nodev = true,
                "noexec" => mount.noexec = true,
                "slave" | "rslave" | "shared" | "rshared" => {
                    return Err(bad(&format!(
                        "`{flag}` propagation is not offered: a container's mounts are private to it"
                    )));
                }
                other => return Err(bad(&format!("unknown mount flag `{other}`"))),
            }
        }
        Ok(mount)
    }

    /// `--container-mounts=A,B,...`.
    pub fn parse_list(text: &str, cwd: &str) -> Result<Vec<ContainerMount>, ContainerError> {
        if text.len() > MAX_CONTAINER_TEXT {
            return Err(ContainerError::Mount { text: text.to_string(), why: "the list is too long".into() });
        }
        let mounts: Vec<ContainerMount> = text
            .split(',')
            .filter(|e| !e.is_empty())
            .map(|e| ContainerMount::parse(e, cwd))
            .collect::<Result<_, _>>()?;
        if mounts.len() > MAX_CONTAINER_MOUNTS {
            return Err(ContainerError::Mount {
                text: text.to_string(),
                why: format!("more than {MAX_CONTAINER_MOUNTS} mounts"),
            });
        }
        Ok(mounts)
    }
}

impl std::fmt::Display for ContainerMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            MountSource::Path(p) => f.write_str(p)?,
            MountSource::Tmpfs => f.write_str("tmpfs")?,
            MountSource::Umount => f.write_str("umount")?,
        }
        write!(f, ":{}", self.target)?;
        let flags: Vec<&str> = [
            (self.readonly, "ro"),
            (self.non_recursive, "bind"),
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if !flags.is_empty() {
            write!(f, ":{}", flags.join("+"))?;
        }
        Ok(())
    }
}

/// Whether `text` is a content digest as registries spell them (`sha256:` and 64 lower-case hex digits).
pub fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
}

impl ContainerSpec {
    /// The image to run: the pinned digest of the image's repository when there is one, else the image as given.
    pub fn image_to_run(&self) -> Option<ImageRef> {
        match (&self.image, &self.pinned_digest) {
            (Some(ImageRef::Registry(r)), Some(digest)) => {
                Some(ImageRef::Registry(RegistryImage { reference: ImageTag::Digest(digest.clone()), ..r.clone() }))
            }
            (image, _) => image.clone(),
        }
    }

    /// Checks what a client could have sent without parsing (names, paths, sizes): the controller refuses a spec
    /// that breaks these before it is replicated.
    pub fn validate(&self) -> Result<(), ContainerError> {
        let value = |option, text: &str, why| ContainerError::Value { option, text: text.to_string(), why };
        if let Some(digest) = &self.pinned_digest
            && !is_digest(digest)
        {
            return Err(value("image", digest, "a pinned digest is sha256: and 64 lower-case hex digits"));
        }
        if self.image.is_none() && self.name.is_none() {
            return Err(value("image", "", "a container needs an image, or the name of one an earlier step made"));
        }
        if let Some(name) = &self.name {
            let ok = !name.is_empty()
                && name.len() <= 128
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !ok {
                return Err(value("name", name, "a name is 1 to 128 letters, digits, _ . or -"));
            }
        }
        if let Some(dir) = &self.workdir
            && (!dir.starts_with('/') || dir.len() > MAX_CONTAINER_TEXT || dir.contains('\0'))
        {
            return Err(value("workdir", dir, "the working directory must be an absolute path"));
        }
        if let Some(path) = &self.save
            && (!path.starts_with('/') || path.len() > MAX_CONTAINER_TEXT || path.contains('\0'))
        {
            return Err(value("save", path, "the file to save to must be an absolute path"));
        }
        if self.env.len() > MAX_CONTAINER_ENV {
            return Err(value("env", "", "too many names"));
        }
        for name in &self.env {
            let ok = !name.is_empty()
                && name.len() <= 256
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(value("env", name, "a variable name is letters, digits and _, not starting with a digit"));
            }
        }
        if self.mounts.len() > MAX_CONTAINER_MOUNTS {
            return Err(value("mounts", "", "too many mounts"));
        }
        for m in &self.mounts {
            let path_ok = |p: &str| p.starts_with('/') && p.len() <= MAX_CONTAINER_TEXT && !p.contains(['\0', ',']);
            let source_ok = match &m.source {
                MountSource::Path(p) => path_ok(p),
                MountSource::Tmpfs | MountSource::Umount => true,
            };
            if !source_ok || !path_ok(&m.target) || m.target == "/" {
                return Err(ContainerError::Mount { text: m.to_string(), why: "paths must be absolute".into() });
            }
        }
        if let Some(ImageRef::File(path)) = &self.image
            && (path.contains('\0') || path.len() > MAX_CONTAINER_TEXT)
        {
            return Err(value("image", path, "not a usable path"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(text: &str) -> RegistryImage {
        match ImageRef::parse(text).unwrap() {
            ImageRef::Registry(r) => r,
            other => panic!("{text} parsed as {other:?}"),
        }
    }

    #[test]
    fn image_references_read_as_enroot_and_docker_spell_them() {
        let ngc = registry("nvcr.io#nvidia/pytorch:24.05-py3");
        assert_eq!((ngc.registry.as_str(), ngc.repository.as_str()), ("nvcr.io", "nvidia/pytorch"));
        assert_eq!(ngc.reference, ImageTag::Tag("24.05-py3".into()));
        assert_eq!(registry("nvcr.io/nvidia/pytorch:24.05-py3"), ngc, "docker's spelling of the same image");
        let hub = registry("ubuntu");
        assert_eq!((hub.registry.as_str(), hub.repository.as_str()), ("docker.io", "library/ubuntu"));
        assert_eq!(hub.reference, ImageTag::Tag("latest".into()));
        let local = registry("alice@127.0.0.1:5000#team/img:v1");
        assert_eq!(local.user.as_deref(), Some("alice"));
        assert_eq!((local.registry.as_str(), local.repository.as_str()), ("127.0.0.1:5000", "team/img"));
        let digest = format!("sha256:{}", "ab".repeat(32));
        let pinned = registry(&format!("localhost:5000/img@{digest}"));
        assert_eq!(pinned.reference, ImageTag::Digest(digest.clone()));
        assert_eq!(pinned.user, None);
        assert_eq!(registry("docker://ubuntu:22.04").reference, ImageTag::Tag("22.04".into()));
        // What is shown reads back as the same image.
        for text in ["nvcr.io#nvidia/pytorch:24.05-py3", "alice@127.0.0.1:5000#team/img:v1", "ubuntu"] {
            let image = ImageRef::parse(text).unwrap();
            assert_eq!(ImageRef::parse(&image.to_string()).unwrap(), image);
        }
    }

    #[test]
    fn a_path_is_an_image_file_and_a_relative_one_is_resolved_where_the_user_stands() {
        assert_eq!(ImageRef::parse("/data/pytorch.sqsh").unwrap(), ImageRef::File("/data/pytorch.sqsh".into()));
        assert_eq!(
            ImageRef::parse_in("./images/../pytorch.sqsh", "/home/alice").unwrap(),
            ImageRef::File("/home/alice/pytorch.sqsh".into())
        );
        assert!(ImageRef::parse("./x.sqsh").is_err(), "unresolved relative paths never reach a node");
    }

    #[test]
    fn bad_image_references_say_what_is_wrong() {
        for (text, why) in [
            ("", "empty"),
            ("Ubuntu", "lower-case"),
            ("ubuntu:", "a tag is"),
            ("ubuntu@sha256:12", "64 lower-case hex"),
            ("#ubuntu", "registry before #"),
            ("@ubuntu", "user before @"),
            ("ubu ntu", "space"),
        ] {
            let message = ImageRef::parse(text).unwrap_err().to_string();
            assert!(message.contains(why), "{text:?}: {message}");
            assert!(message.contains(&format!("`{text}`")), "{message}");
        }
    }

    #[test]
    fn mounts_read_as_pyxis_reads_them() {
        let mounts =
            ContainerMount::parse_list("/data:/data:ro,scratch:/scratch,/ckpt,tmpfs:/tmp:nosuid+rw", "/home/a")
                .unwrap();
        assert_eq!(mounts[0].source, MountSource::Path("/data".into()));
        assert!(mounts[0].readonly);
        assert_eq!(mounts[1].source, MountSource::Path("/home/a/scratch".into()));
        assert_eq!(mounts[1].target, "/scratch");
        assert_eq!(mounts[2].target, "/ckpt", "a source alone is mounted at the same path");
        assert_eq!((mounts[3].source.clone(), mounts[3].nosuid, mounts[3].readonly), (MountSource::Tmpfs, true, false));
        assert_eq!(mounts[0].to_string(), "/data:/data:ro");
        for (text, why) in [
            ("/a:relative", "absolute"),
            ("/a:/b:ro+shared", "propagation"),
            ("/a:/b:bogus", "unknown mount flag `bogus`"),
            ("tmpfs", "destination"),
            ("/a:/", "root"),
            ("/a:/b:ro:x", "more than three"),
        ] {
            let message = ContainerMount::parse(text, "/").unwrap_err().to_string();
            assert!(message.contains(why), "{text}: {message}");
        }
    }

    #[test]
    fn a_spec_from_a_client_is_checked_before_it_is_replicated() {
        let image = Some(ImageRef::parse("ubuntu").unwrap());
        assert!(ContainerSpec { image: image.clone(), ..ContainerSpec::default() }.validate().is_ok());
        assert!(ContainerSpec::default().validate().is_err(), "neither an image nor a name");
        let named = ContainerSpec { name: Some("../etc".into()), image: image.clone(), ..ContainerSpec::default() };
        assert!(named.validate().unwrap_err().to_string().contains("a name is"));
        let env = ContainerSpec { env: vec!["PATH=x".into()], image, ..ContainerSpec::default() };
        assert!(env.validate().is_err());
    }
}

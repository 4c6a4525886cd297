//! Image files on the node: docker archives (`docker save`), OCI archives (a tar of an OCI image layout) and squashfs
//! files (enroot's format). They are told apart by their first bytes, never by their names, and read through the
//! descriptor the caller opened as the job's user, so the user's own permissions decide what can be imported.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::error::ImageError;
use super::registry::{self, Descriptor, Index, Manifest, ManifestKind};
use super::unpack::LayerCheck;
use super::{MAX_JSON_BYTES, MAX_LAYERS, hex};

/// Most members an image archive may hold (a layout holds a few per layer).
const MAX_ARCHIVE_MEMBERS: usize = 100_000;
/// Symbolic links followed to find one member (docker save links repeated layers).
const MAX_MEMBER_LINKS: usize = 8;
/// Nested indexes followed in an OCI layout.
const MAX_INDEX_DEPTH: usize = 4;

/// What an image file is, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    Squashfs,
    /// A tar: a docker or an OCI archive, decided by what it holds.
    Tar,
}

pub(crate) fn sniff(image: &str, file: &File) -> Result<FileFormat, ImageError> {
    let mut head = [0u8; 512];
    let mut filled = 0;
    while filled < head.len() {
        match file.read_at(&mut head[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(ImageError::File { image: image.to_string(), source }),
        }
    }
    let head = &head[..filled];
    if head.starts_with(b"hsqs") {
        return Ok(FileFormat::Squashfs);
    }
    if head.len() >= 262 && &head[257..262] == b"ustar" {
        return Ok(FileFormat::Tar);
    }
    let hint = if head.starts_with(&[0x1f, 0x8b]) || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        ": it is compressed; decompress it first (gunzip / zstd -d)".to_string()
    } else {
        String::new()
    };
    Err(ImageError::UnknownFormat { image: image.to_string(), hint })
}

/// A byte range of the file, read by position so the file's offset does not matter.
pub(crate) struct Region<'a> {
    file: &'a File,
    offset: u64,
    remaining: u64,
}

impl<'a> Region<'a> {
    pub(crate) fn new(file: &'a File, offset: u64, len: u64) -> Self {
        Region { file, offset, remaining: len }
    }
}

impl Read for Region<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.offset)?;
        self.offset += n as u64;
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[derive(Debug, Clone)]
enum Member {
    Data {
        offset: u64,
        size: u64,
    },
    /// A symbolic or hard link to another member, by its archive path.
    Link(String),
}

/// The members of an image archive by path (`./` dropped).
pub(crate) struct Archive<'a> {
    file: &'a File,
    image: String,
    members: HashMap<String, Member>,
}

/// `a/./b/../c` as `a/c`, relative to the archive's top; `None` if it climbs out.
fn clean(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

impl<'a> Archive<'a> {
    pub(crate) fn open(image: &str, file: &'a File) -> Result<Archive<'a>, ImageError> {
        let len = file.metadata().map_err(|source| ImageError::File { image: image.to_string(), source })?.len();
        let mut tar = tar::Archive::new(Region::new(file, 0, len));
        let bad = |why: String| ImageError::BadArchive { image: image.to_string(), why };
        let mut members = HashMap::new();
        for entry in tar.entries().map_err(|e| bad(e.to_string()))? {
            let entry = entry.map_err(|e| bad(format!("not a valid tar: {e}")))?;
            if members.len() >= MAX_ARCHIVE_MEMBERS {
                return Err(bad(format!("it holds more than {MAX_ARCHIVE_MEMBERS} members")));
            }
            let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let Some(name) = clean(&path) else { continue };
            let kind = entry.header().entry_type();
            let link = || entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned());
            let member = if kind.is_file() || kind == tar::EntryType::Continuous {
                Member::Data { offset: entry.raw_file_position(), size: entry.size() }
            } else if kind.is_symlink() {
                // Relative to the link's directory.
                let Some(target) = link() else { continue };
                let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                match clean(&format!("{dir}/{target}")) {
                    Some(target) => Member::Link(target),
                    None => continue,
                }
            } else if kind.is_hard_link() {
                match link().and_then(|l| clean(&l)) {
                    Some(target) => Member::Link(target),
                    None => continue,
                }
            } else {
                continue;
            };
            members.insert(name, member);
        }
        Ok(Archive { file, image: image.to_string(), members })
    }

    fn bad(&self, why: String) -> ImageError {
        ImageError::BadArchive { image: self.image.clone(), why }
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }

    /// Offset and size of a member's bytes, links followed.
    fn locate(&self, name: &str) -> Result<(u64, u64), ImageError> {
        let mut current = name.to_string();
        for _ in 0..=MAX_MEMBER_LINKS {
            match self.members.get(&current) {
                Some(Member::Data { offset, size }) => return Ok((*offset, *size)),
                Some(Member::Link(target)) => current = target.clone(),
                None => return Err(self.bad(format!("`{name}` is missing"))),
            }
        }
        Err(self.bad(format!("`{name}` is a chain of too many links")))
    }

    pub(crate) fn reader(&self, name: &str) -> Result<Region<'a>, ImageError> {
        let (offset, size) = self.locate(name)?;
        Ok(Region::new(self.file, offset, size))
    }

    /// A small member (JSON), at most [`MAX_JSON_BYTES`].
    fn small(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let (offset, size) = self.locate(name)?;
        if size > MAX_JSON_BYTES {
            return Err(ImageError::TooLarge {
                image: self.image.clone(),
                what: format!("`{name}`"),
                limit_bytes: MAX_JSON_BYTES,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        Region::new(self.file, offset, size)
            .read_to_end(&mut bytes)
            .map_err(|source| ImageError::File { image: self.image.clone(), source })?;
        Ok(bytes)
    }

    fn blob_name(digest: &str) -> String {
        format!("blobs/{}", digest.replacen(':', "/", 1))
    }

    /// A blob of an OCI layout, digest checked.
    fn blob(&self, digest: &str, what: &str) -> Result<Vec<u8>, ImageError> {
        registry::check_digest(&self.image, what, digest)?;
        let bytes = self.small(&Self::blob_name(digest))?;
        let actual = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if actual != digest {
            return Err(ImageError::DigestMismatch {
                image: self.image.clone(),
                what: what.into(),
                expected: digest.into(),
                actual,
            });
        }
        Ok(bytes)
    }
}

/// What to import from an archive: its cache key, config, and layers (member names) in order.
#[derive(Debug)]
pub(crate) struct ArchivePlan {
    pub digest: String,
    pub config: Vec<u8>,
    pub layers: Vec<(String, LayerCheck)>,
    pub kind: &'static str,
}

/// Reads an archive's manifest: an OCI layout when `oci-layout` and `index.json` are there (docker 25 writes both
/// forms; the OCI one carries digests for everything), a docker archive when `manifest.json` is.
pub(crate) fn plan(archive: &Archive<'_>) -> Result<ArchivePlan, ImageError> {
    if archive.has("index.json") && archive.has("oci-layout") {
        plan_oci(archive)
    } else if archive.has("manifest.json") {
        plan_docker(archive)
    } else {
        Err(archive.bad("neither an OCI layout (index.json, oci-layout) nor a docker archive (manifest.json)".into()))
    }
}

/// OCI archive: the cache key is the image manifest's digest, the same key a registry pull of that manifest uses
/// (every blob is checked against it, so the two cannot differ).
fn plan_oci(archive: &Archive<'_>) -> Result<ArchivePlan, ImageError> {
    let image = archive.image.as_str();
    let json = |what: &str, e: serde_json::Error| archive.bad(format!("{what}: {e}"));
    let index_bytes = archive.small("index.json")?;
    let mut index: Index = serde_json::from_slice(&index_bytes).map_err(|e| json("index.json", e))?;
    for _ in 0..MAX_INDEX_DEPTH {
        let chosen = if index.manifests.iter().any(|m| m.platform.is_some()) && index.manifests.len() > 1 {
            registry::pick_platform(image, &index)?.clone()
        } else {
            index.manifests.first().cloned().ok_or_else(|| archive.bad("index.json lists no image".into()))?
        };
        let bytes = archive.blob(&chosen.digest, "manifest")?;
        match registry::manifest_kind(image, Some(&chosen.media_type), &bytes)? {
            ManifestKind::Index => {
                index = serde_json::from_slice(&bytes).map_err(|e| json("nested index", e))?;
            }
            ManifestKind::Manifest => {
                let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| json("manifest", e))?;
                registry::validate_manifest(image, &manifest)?;
                for layer in &manifest.layers {
                    registry::check_layer_type(image, layer)?;
                }
                let config = archive.blob(&manifest.config.digest, "config")?;
                let layers = manifest
                    .layers
                    .iter()
                    .map(|l: &Descriptor| (Archive::blob_name(&l.digest), LayerCheck::Stored(l.digest.clone())))
                    .collect();
                return Ok(ArchivePlan { digest: chosen.digest, config, layers, kind: "OCI archive" });
            }
        }
    }
    Err(archive.bad(format!("indexes nested more than {MAX_INDEX_DEPTH} deep")))
}

/// Docker archive: the cache key is the sha256 of the config blob (docker's image id). The config lists each layer's
/// uncompressed digest (`rootfs.diff_ids`), and every layer is checked against it, so the key covers the content and
/// one user's archive cannot stand in for another image with the same id.
fn plan_docker(archive: &Archive<'_>) -> Result<ArchivePlan, ImageError> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "Config")]
        config: String,
        #[serde(rename = "Layers", default)]
        layers: Vec<String>,
    }
    #[derive(Deserialize)]
    struct RootFs {
        #[serde(default)]
        diff_ids: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Config {
        rootfs: Option<RootFs>,
    }
    let bytes = archive.small("manifest.json")?;
    let entries: Vec<Entry> = serde_json::from_slice(&bytes).map_err(|e| archive.bad(format!("manifest.json: {e}")))?;
    // `docker save a b` writes several images; the first is the one named first.
    let entry = entries.into_iter().next().ok_or_else(|| archive.bad("manifest.json lists no image".into()))?;
    if entry.layers.len() > MAX_LAYERS {
        return Err(archive.bad(format!("{} layers (at most {MAX_LAYERS} are accepted)", entry.layers.len())));
    }
    let config_name = clean(&entry.config).ok_or_else(|| archive.bad("the config path leaves the archive".into()))?;
    let config = archive.small(&config_name)?;
    let parsed: Config = serde_json::from_slice(&config).map_err(|e| archive.bad(format!("config: {e}")))?;
    let diff_ids = parsed.rootfs.map(|r| r.diff_ids).unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(archive.bad(format!(
            "the config lists {} layer digests for {} layers",
            diff_ids.len(),
            entry.layers.len()
        )));
    }
    let mut layers = Vec::with_capacity(diff_ids.len());
    for (name, diff_id) in entry.layers.iter().zip(diff_ids) {
        registry::check_digest(&archive.image, "layer", &diff_id)?;
        let name = clean(name).ok_or_else(|| archive.bad("a layer path leaves the archive".into()))?;
        layers.push((name, LayerCheck::Uncompressed(diff_id)));
    }
    let digest = format!("sha256:{}", hex(&Sha256::digest(&config)));
    Ok(ArchivePlan { digest, config, layers, kind: "docker archive" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_inside_the_archive() {
        assert_eq!(clean("./a/./b/../c").as_deref(), Some("a/c"));
        assert_eq!(clean("../x"), None);
        assert_eq!(clean("blobs/sha256/ab").as_deref(), Some("blobs/sha256/ab"));
    }

    #[test]
    fn formats_are_told_by_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).expect("write");
            File::open(path).expect("open")
        };
        let mut squash = b"hsqs".to_vec();
        squash.resize(4096, 0);
        assert_eq!(sniff("x", &write("image.tar", &squash)).expect("squashfs"), FileFormat::Squashfs);
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_size(2);
        header.set_cksum();
        builder.append_data(&mut header, "manifest.json", &b"[]"[..]).expect("append");
        let tar = builder.into_inner().expect("tar");
        assert_eq!(sniff("x", &write("image.sqsh", &tar)).expect("tar"), FileFormat::Tar);
        let error = sniff("x", &write("a.tar.gz", &[0x1f, 0x8b, 8, 0])).expect_err("gzip");
        assert!(error.to_string().contains("decompress it first"), "{error}");
        assert!(sniff("x", &write("empty", b"")).is_err());
        let archive_file = write("list.tar", &tar);
        let archive = Archive::open("x", &archive_file).expect("archive");
        assert!(plan(&archive).expect_err("empty list").to_string().contains("lists no image"));
    }
}

//! What can go wrong while resolving, fetching or importing an image, worded for the user who asked for it: each
//! message names the image and the registry or file, and says what to do where there is something to do.

use std::path::PathBuf;

/// Why an image could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "image {image}: the registry refused access (HTTP {status}): check ~/.config/enroot/.credentials or ~/.docker/config.json{detail}"
    )]
    AccessDenied { image: String, status: u16, detail: String },
    #[error("image {image}: cannot reach registry {registry}: {reason}")]
    Unreachable { image: String, registry: String, reason: String },
    #[error("image {image}: registry {registry} has no {what} (HTTP 404): check the image name and tag")]
    NotFound { image: String, registry: String, what: String },
    #[error("image {image}: registry {registry} answered HTTP {status} for {what}{detail}")]
    Registry { image: String, registry: String, status: u16, what: String, detail: String },
    #[error("image {image}: the {what} does not match its digest (expected {expected}, got {actual})")]
    DigestMismatch { image: String, what: String, expected: String, actual: String },
    #[error("image {image}: unsupported media type `{media_type}` for the {what}")]
    UnsupportedMediaType { image: String, what: String, media_type: String },
    #[error("image {image}: no variant for platform {platform} (the image offers {offered})")]
    NoPlatform { image: String, platform: String, offered: String },
    #[error("image {image}: invalid {what}: {why}")]
    BadManifest { image: String, what: String, why: String },
    #[error("image {image}: the {what} is larger than {limit_bytes} bytes")]
    TooLarge { image: String, what: String, limit_bytes: u64 },
    #[error("image {image}: bad archive: {why}")]
    BadArchive { image: String, why: String },
    #[error("image {image}: not a squashfs file, a docker archive (docker save) or an OCI archive{hint}")]
    UnknownFormat { image: String, hint: String },
    #[error("image {image}: cannot read the file: {source}")]
    File { image: String, source: std::io::Error },
    #[error("image {image}: unsquashfs failed: {why}")]
    Unsquashfs { image: String, why: String },
    #[error("image cache {} is full (no space left on device) while importing {image}: free space or lower the cache limit", cache.display())]
    CacheFull { cache: PathBuf, image: String },
    #[error("image {image}: gave up after {waited_ms} ms waiting for another import of the same image ({})", lock.display())]
    LockTimeout { image: String, lock: PathBuf, waited_ms: u64 },
    #[error("image cache {}: {context}: {source}", path.display())]
    Store { path: PathBuf, context: String, source: std::io::Error },
}

impl ImageError {
    /// An I/O error on the store's own files: ENOSPC or EDQUOT become [`ImageError::CacheFull`], which says what the
    /// user (or the administrator) can do; the rest name the path and the step.
    pub(crate) fn store(
        cache: &std::path::Path,
        image: &str,
        path: &std::path::Path,
        context: &str,
        source: std::io::Error,
    ) -> ImageError {
        if is_no_space(&source) {
            return ImageError::CacheFull { cache: cache.to_path_buf(), image: image.to_string() };
        }
        ImageError::Store { path: path.to_path_buf(), context: context.to_string(), source }
    }
}

/// Out of space or quota: both mean the cache's file system cannot take the image.
pub(crate) fn is_no_space(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || error.kind() == std::io::ErrorKind::StorageFull
        || error.kind() == std::io::ErrorKind::QuotaExceeded
}

//! A blocking client for the Docker Registry HTTP API v2 / OCI distribution API: manifests (an index or manifest
//! list narrowed to this host's platform), the config blob, and layer blobs streamed to disk while their digests are
//! checked. Authentication follows the registry's `WWW-Authenticate` challenge: `Basic` with the user's credentials,
//! or `Bearer` with a token from the realm the registry names.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use drover_state::container::{ImageTag, RegistryImage};

use super::credentials::RegistryCredentials;
use super::error::ImageError;
use super::{MAX_JSON_BYTES, MAX_LAYERS, hex};

/// Largest layer blob accepted (compressed); beyond it, it is not an image a node should cache.
pub(crate) const MAX_LAYER_BYTES: u64 = 256 * 1024 * 1024 * 1024;
/// Largest token or error answer read.
const MAX_SMALL_BODY_BYTES: u64 = 1024 * 1024;
/// Redirects followed for a blob (registries send blob GETs on to their storage).
const MAX_REDIRECTS: u32 = 5;

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.docker.distribution.manifest.list.v2+json, \
                      application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const CONFIG_TYPES: [&str; 2] =
    ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];
/// Layer media types: plain, gzip and zstd tars under their OCI and docker names (the foreign/non-distributable
/// variants are the same bytes, fetched from the registry like any other).
const LAYER_TYPES: [&str; 9] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// A content descriptor from a manifest or index.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// What a manifest document is, from its declared type or, failing that, its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManifestKind {
    Index,
    Manifest,
}

pub(crate) fn manifest_kind(image: &str, content_type: Option<&str>, bytes: &[u8]) -> Result<ManifestKind, ImageError> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        #[serde(rename = "schemaVersion")]
        schema_version: Option<u64>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| ImageError::BadManifest {
        image: image.to_string(),
        what: "manifest".into(),
        why: e.to_string(),
    })?;
    // The document's own mediaType is what its digest covers; a proxy's Content-Type is only a hint.
    let declared =
        probe.media_type.clone().or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()));
    match declared.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => return Ok(ManifestKind::Index),
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => return Ok(ManifestKind::Manifest),
        _ => {}
    }
    if probe.schema_version == Some(1) {
        return Err(ImageError::UnsupportedMediaType {
            image: image.to_string(),
            what: "manifest".into(),
            media_type: "docker schema 1 (repush the image with a current docker or skopeo)".into(),
        });
    }
    if probe.manifests.is_some() {
        return Ok(ManifestKind::Index);
    }
    if probe.layers.is_some() && matches!(declared.as_deref(), None | Some("application/json") | Some("")) {
        return Ok(ManifestKind::Manifest);
    }
    Err(ImageError::UnsupportedMediaType {
        image: image.to_string(),
        what: "manifest".into(),
        media_type: declared.unwrap_or_else(|| "none".into()),
    })
}

/// `sha256:` and 64 lower-case hex digits; anything else is refused before it is used in a URL or a file name.
pub(crate) fn check_digest(image: &str, what: &str, digest: &str) -> Result<(), ImageError> {
    let ok = digest
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(ImageError::BadManifest {
            image: image.to_string(),
            what: what.to_string(),
            why: format!("unsupported digest `{}` (only sha256 is)", digest.chars().take(80).collect::<String>()),
        })
    }
}

pub(crate) fn check_layer_type(image: &str, layer: &Descriptor) -> Result<(), ImageError> {
    if LAYER_TYPES.contains(&layer.media_type.as_str()) {
        return Ok(());
    }
    Err(ImageError::UnsupportedMediaType {
        image: image.to_string(),
        what: "layer".into(),
        media_type: layer.media_type.clone(),
    })
}

/// This host's platform in OCI's words (`linux/amd64`, `linux/arm64`).
pub(crate) fn host_platform() -> (&'static str, &'static str) {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", architecture)
}

/// The index entry for this host's platform; attestation entries (`unknown/unknown`) never match.
pub(crate) fn pick_platform<'a>(image: &str, index: &'a Index) -> Result<&'a Descriptor, ImageError> {
    let (os, architecture) = host_platform();
    let candidates = || {
        index.manifests.iter().filter(move |m| {
            m.platform.as_ref().is_some_and(|p| p.os == os && p.architecture == architecture)
                && matches!(m.media_type.as_str(), OCI_MANIFEST | DOCKER_MANIFEST | "")
        })
    };
    // arm64's variant is v8 or absent; prefer an entry without a variant or with v8, then any.
    candidates()
        .find(|m| m.platform.as_ref().is_some_and(|p| p.variant.as_deref().is_none_or(|v| v == "v8")))
        .or_else(|| candidates().next())
        .ok_or_else(|| ImageError::NoPlatform {
            image: image.to_string(),
            platform: format!("{os}/{architecture}"),
            offered: index
                .manifests
                .iter()
                .filter_map(|m| m.platform.as_ref().map(|p| format!("{}/{}", p.os, p.architecture)))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Where the registry's API lives: `docker.io` is served by `registry-1.docker.io`; https unless the host is loopback
/// or listed as insecure.
pub(crate) fn registry_base(registry: &str, insecure: &[String]) -> String {
    let host = if registry == "docker.io" || registry == "index.docker.io" { "registry-1.docker.io" } else { registry };
    let scheme = if plain_http_allowed(host, insecure) { "http" } else { "https" };
    format!("{scheme}://{host}")
}

/// Loopback hosts (with any port) and the configured insecure registries may speak plain http.
pub(crate) fn plain_http_allowed(host_port: &str, insecure: &[String]) -> bool {
    let host = if let Some(rest) = host_port.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host_port.rsplit_once(':').map_or(host_port, |(h, _)| h)
    };
    let loopback =
        host == "localhost" || host == "::1" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback());
    loopback || insecure.iter().any(|i| i == host_port || i == host)
}

pub(crate) fn manifest_url(base: &str, repository: &str, reference: &str) -> String {
    format!("{base}/v2/{repository}/manifests/{reference}")
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

/// Parses the first challenge of a `WWW-Authenticate` value: `Basic realm="x"` or
/// `Bearer realm="https://auth/token",service="registry",scope="repository:a/b:pull"` (quoted or bare values,
/// backslash escapes inside quotes).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(char::is_whitespace).unwrap_or((header, ""));
    let mut params: Vec<(String, String)> = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',' && !c.is_whitespace())).collect();
        if key.is_empty() {
            break;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next_if_eq(&'=').is_none() {
            // A second scheme begins (`Basic realm="x", Bearer ...` is rare): only the first challenge is used.
            break;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect::<String>().trim().to_string();
        }
        params.push((key.to_ascii_lowercase(), value));
        if params.len() > 32 {
            break;
        }
    }
    let get = |k: &str| params.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer { realm: get("realm")?, service: get("service"), scope: get("scope") })
    } else {
        None
    }
}

/// Query-string encoding (RFC 3986 unreserved characters kept).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The manifest a reference resolved to.
pub(crate) struct Resolved {
    /// `sha256:...` of the image manifest (the platform's, when the reference named an index).
    pub digest: String,
    pub manifest: Manifest,
}

/// One image's conversation with its registry. Shared by the layer download threads.
pub(crate) struct RegistryClient {
    agent: ureq::Agent,
    image: String,
    registry: String,
    base: String,
    repository: String,
    credentials: Option<(String, String)>,
    insecure: Vec<String>,
    /// The `Authorization` value that worked last (a bearer token or basic credentials).
    authorization: Mutex<Option<String>>,
    timeout_ms: u64,
    cache_root: PathBuf,
}

impl RegistryClient {
    pub(crate) fn new(
        image: &RegistryImage,
        credentials: &RegistryCredentials,
        insecure: &[String],
        timeout_ms: u64,
        cache_root: &Path,
    ) -> RegistryClient {
        let timeout = Some(Duration::from_millis(timeout_ms.max(1)));
        let config = ureq::config::Config::builder()
            // Statuses are answers to act on here (401 starts authentication), not errors.
            .http_status_as_error(false)
            .max_redirects(MAX_REDIRECTS)
            .timeout_connect(timeout)
            .timeout_resolve(timeout)
            .timeout_send_request(timeout)
            .timeout_recv_response(timeout)
            // A stalled transfer ends after the timeout without data; a long healthy one may run on.
            .timeout_per_read(timeout)
            .user_agent("drover-agent")
            .build();
        RegistryClient {
            agent: ureq::Agent::new_with_config(config),
            image: drover_state::container::ImageRef::Registry(image.clone()).to_string(),
            registry: image.registry.clone(),
            base: registry_base(&image.registry, insecure),
            repository: image.repository.clone(),
            credentials: credentials.for_registry(&image.registry, image.user.as_deref()),
            insecure: insecure.to_vec(),
            authorization: Mutex::new(None),
            timeout_ms,
            cache_root: cache_root.to_path_buf(),
        }
    }

    pub(crate) fn image(&self) -> &str {
        &self.image
    }

    fn unreachable(&self, host: &str, error: ureq::Error) -> ImageError {
        let reason = match &error {
            ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                format!("no answer within {} ms", self.timeout_ms)
            }
            ureq::Error::Timeout(_) => format!("no answer within {} ms", self.timeout_ms),
            ureq::Error::HostNotFound => "host not found".to_string(),
            ureq::Error::Tls(_) | ureq::Error::Rustls(_) => {
                format!("TLS failed ({error}); a registry without TLS must be listed as insecure")
            }
            other => other.to_string(),
        };
        ImageError::Unreachable { image: self.image.clone(), registry: host.to_string(), reason }
    }

    /// GET with the current authorization; on 401 answers the challenge once and retries. Non-2xx answers become
    /// errors naming `what`.
    fn get(&self, url: &str, accept: Option<&str>, what: &str) -> Result<ureq::http::Response<ureq::Body>, ImageError> {
        let mut challenged = false;
        loop {
            let mut request = self.agent.get(url);
            if let Some(accept) = accept {
                request = request.header("Accept", accept);
            }
            let authorization = self.authorization.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(value) = &authorization {
                request = request.header("Authorization", value);
            }
            let mut response = request.call().map_err(|e| self.unreachable(&self.registry, e))?;
            let status = response.status().as_u16();
            if status == 401 && !challenged {
                challenged = true;
                let header = response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("");
                match parse_challenge(header) {
                    Some(challenge) => {
                        let value = self.authenticate(&challenge)?;
                        *self.authorization.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
                        continue;
                    }
                    None => return Err(self.denied(401, &mut response)),
                }
            }
            return match status {
                200..=299 => Ok(response),
                401 | 403 => Err(self.denied(status, &mut response)),
                404 => Err(ImageError::NotFound {
                    image: self.image.clone(),
                    registry: self.registry.clone(),
                    what: what.to_string(),
                }),
                _ => Err(ImageError::Registry {
                    image: self.image.clone(),
                    registry: self.registry.clone(),
                    status,
                    what: what.to_string(),
                    detail: error_detail(&mut response),
                }),
            };
        }
    }

    fn denied(&self, status: u16, response: &mut ureq::http::Response<ureq::Body>) -> ImageError {
        let mut detail = error_detail(response);
        if self.credentials.is_none() {
            detail.push_str(&format!(" (no credentials for {} were found)", self.registry));
        }
        ImageError::AccessDenied { image: self.image.clone(), status, detail }
    }

    fn basic(&self) -> Option<String> {
        self.credentials.as_ref().map(|(login, password)| {
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{login}:{password}")))
        })
    }

    /// The `Authorization` value that answers `challenge`.
    fn authenticate(&self, challenge: &Challenge) -> Result<String, ImageError> {
        let (realm, service, scope) = match challenge {
            Challenge::Basic => {
                return self.basic().ok_or_else(|| ImageError::AccessDenied {
                    image: self.image.clone(),
                    status: 401,
                    detail: format!(
                        " (the registry wants a login and no credentials for {} were found)",
                        self.registry
                    ),
                });
            }
            Challenge::Bearer { realm, service, scope } => (realm, service, scope),
        };
        let realm_host = realm
            .strip_prefix("https://")
            .or_else(|| realm.strip_prefix("http://"))
            .map(|rest| rest.split(['/', '?']).next().unwrap_or(""))
            .unwrap_or("");
        // Credentials go to the realm the registry names, as docker does, but never in clear text over the network.
        if realm_host.is_empty() || (!realm.starts_with("https://") && !plain_http_allowed(realm_host, &self.insecure))
        {
            return Err(ImageError::Registry {
                image: self.image.clone(),
                registry: self.registry.clone(),
                status: 401,
                what: "authentication".into(),
                detail: format!(": refusing the token service `{realm}` (it must be https)"),
            });
        }
        let scope = scope.clone().unwrap_or_else(|| format!("repository:{}:pull", self.repository));
        let mut url = realm.clone();
        url.push(if url.contains('?') { '&' } else { '?' });
        if let Some(service) = service {
            url.push_str(&format!("service={}&", percent_encode(service)));
        }
        url.push_str(&format!("scope={}", percent_encode(&scope)));
        let mut request = self.agent.get(&url);
        if let Some(basic) = self.basic() {
            request = request.header("Authorization", basic);
        }
        let mut response = request.call().map_err(|e| self.unreachable(realm_host, e))?;
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return Err(self.denied(status, &mut response));
        }
        if !(200..=299).contains(&status) {
            return Err(ImageError::Registry {
                image: self.image.clone(),
                registry: realm_host.to_string(),
                status,
                what: "a token".into(),
                detail: error_detail(&mut response),
            });
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_SMALL_BODY_BYTES)
            .read_to_vec()
            .map_err(|e| self.unreachable(realm_host, e))?;
        let token: Token = serde_json::from_slice(&body).map_err(|e| ImageError::BadManifest {
            image: self.image.clone(),
            what: format!("token answer from {realm_host}"),
            why: e.to_string(),
        })?;
        let token =
            token.token.or(token.access_token).filter(|t| !t.is_empty()).ok_or_else(|| ImageError::BadManifest {
                image: self.image.clone(),
                what: format!("token answer from {realm_host}"),
                why: "it holds no token".into(),
            })?;
        Ok(format!("Bearer {token}"))
    }

    /// A small JSON document (manifest or config), at most [`MAX_JSON_BYTES`]; with its Content-Type.
    fn small(&self, url: &str, accept: Option<&str>, what: &str) -> Result<(Vec<u8>, Option<String>), ImageError> {
        let mut response = self.get(url, accept, what)?;
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = response.body_mut().with_config().limit(MAX_JSON_BYTES).read_to_vec().map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => {
                ImageError::TooLarge { image: self.image.clone(), what: what.to_string(), limit_bytes: MAX_JSON_BYTES }
            }
            e => self.unreachable(&self.registry, e),
        })?;
        Ok((bytes, content_type))
    }

    /// Fetches a manifest by tag or digest, checking a requested digest against the bytes.
    fn fetch_manifest(&self, reference: &str) -> Result<(Vec<u8>, ManifestKind, String), ImageError> {
        let url = manifest_url(&self.base, &self.repository, reference);
        let what = format!("manifest `{}:{}`", self.repository, reference);
        let (bytes, content_type) = self.small(&url, Some(ACCEPT), &what)?;
        let digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if reference.starts_with("sha256:") && reference != digest {
            return Err(ImageError::DigestMismatch {
                image: self.image.clone(),
                what: "manifest".into(),
                expected: reference.to_string(),
                actual: digest,
            });
        }
        let kind = manifest_kind(&self.image, content_type.as_deref(), &bytes)?;
        Ok((bytes, kind, digest))
    }

    /// Resolves a tag or digest to this platform's image manifest. Always asks the registry, with the user's
    /// credentials: that is what proves the user may read the image, and what notices a moved tag.
    pub(crate) fn resolve(&self, reference: &ImageTag) -> Result<Resolved, ImageError> {
        let reference = match reference {
            ImageTag::Tag(tag) => tag.clone(),
            ImageTag::Digest(digest) => {
                check_digest(&self.image, "reference", digest)?;
                digest.clone()
            }
        };
        let (mut bytes, mut kind, mut digest) = self.fetch_manifest(&reference)?;
        if kind == ManifestKind::Index {
            let index: Index = serde_json::from_slice(&bytes).map_err(|e| self.bad("image index", e))?;
            let chosen = pick_platform(&self.image, &index)?;
            check_digest(&self.image, "image index", &chosen.digest)?;
            (bytes, kind, digest) = self.fetch_manifest(&chosen.digest)?;
            if kind != ManifestKind::Manifest {
                return Err(ImageError::BadManifest {
                    image: self.image.clone(),
                    what: "image index".into(),
                    why: "a nested index is not supported".into(),
                });
            }
        }
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| self.bad("manifest", e))?;
        validate_manifest(&self.image, &manifest)?;
        for layer in &manifest.layers {
            check_layer_type(&self.image, layer)?;
        }
        Ok(Resolved { digest, manifest })
    }

    fn bad(&self, what: &str, error: serde_json::Error) -> ImageError {
        ImageError::BadManifest { image: self.image.clone(), what: what.to_string(), why: error.to_string() }
    }

    fn blob_url(&self, digest: &str) -> String {
        format!("{}/v2/{}/blobs/{}", self.base, self.repository, digest)
    }

    /// The config blob's bytes, digest checked.
    pub(crate) fn config(&self, descriptor: &Descriptor) -> Result<Vec<u8>, ImageError> {
        let (bytes, _) = self.small(&self.blob_url(&descriptor.digest), None, "config blob")?;
        let actual = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if actual != descriptor.digest {
            return Err(ImageError::DigestMismatch {
                image: self.image.clone(),
                what: "config".into(),
                expected: descriptor.digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Streams one blob to `path`, hashing as it goes; the file is removed unless the digest and size match.
    fn download(&self, descriptor: &Descriptor, path: &Path, cancel: &AtomicBool) -> Result<(), ImageError> {
        let result = self.download_inner(descriptor, path, cancel);
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    fn download_inner(&self, descriptor: &Descriptor, path: &Path, cancel: &AtomicBool) -> Result<(), ImageError> {
        let what = format!("layer {}", descriptor.digest);
        let mut response = self.get(&self.blob_url(&descriptor.digest), None, &what)?;
        let mut reader = response.body_mut().as_reader().take(descriptor.size.saturating_add(1));
        let store_error =
            |e: std::io::Error| ImageError::store(&self.cache_root, &self.image, path, "cannot write a layer", e);
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(store_error)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(ImageError::Registry {
                    image: self.image.clone(),
                    registry: self.registry.clone(),
                    status: 0,
                    what: what.clone(),
                    detail: ": cancelled after another layer failed".into(),
                });
            }
            let n = match reader.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(ImageError::Unreachable {
                        image: self.image.clone(),
                        registry: self.registry.clone(),
                        reason: format!("reading {what}: {e}"),
                    });
                }
            };
            total += n as u64;
            hasher.update(&buffer[..n]);
            file.write_all(&buffer[..n]).map_err(store_error)?;
        }
        file.sync_all().map_err(store_error)?;
        let actual = format!("sha256:{}", hex(&hasher.finalize()));
        if actual != descriptor.digest || total != descriptor.size {
            return Err(ImageError::DigestMismatch {
                image: self.image.clone(),
                what: format!("{what} ({total} bytes, {} expected)", descriptor.size),
                expected: descriptor.digest.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// Downloads the layers into `dir` (named by digest, each once), at most `parallel` at a time; the first failure
    /// stops the others. Returns each layer's file, in manifest order.
    pub(crate) fn download_layers(
        &self,
        layers: &[Descriptor],
        dir: &Path,
        parallel: usize,
    ) -> Result<Vec<PathBuf>, ImageError> {
        let mut unique: Vec<&Descriptor> = Vec::new();
        for layer in layers {
            if !unique.iter().any(|u| u.digest == layer.digest) {
                unique.push(layer);
            }
        }
        let next = AtomicUsize::new(0);
        let cancel = AtomicBool::new(false);
        let first_error: Mutex<Option<ImageError>> = Mutex::new(None);
        let path_of = |d: &Descriptor| dir.join(d.digest.replace(':', "-"));
        std::thread::scope(|scope| {
            for _ in 0..parallel.clamp(1, 64).min(unique.len().max(1)) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(layer) = unique.get(i) else { break };
                        if cancel.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Err(e) = self.download(layer, &path_of(layer), &cancel) {
                            cancel.store(true, Ordering::Relaxed);
                            let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                            // The first real failure is the one to report, not a sibling's cancellation.
                            if slot.is_none() {
                                *slot = Some(e);
                            }
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        Ok(layers.iter().map(path_of).collect())
    }
}

/// Checks what the rest of the import relies on: sha256 digests (they become file names), bounded counts and sizes.
pub(crate) fn validate_manifest(image: &str, manifest: &Manifest) -> Result<(), ImageError> {
    if let Some(media_type) = &manifest.media_type
        && media_type != OCI_MANIFEST
        && media_type != DOCKER_MANIFEST
    {
        return Err(ImageError::UnsupportedMediaType {
            image: image.into(),
            what: "manifest".into(),
            media_type: media_type.clone(),
        });
    }
    if !CONFIG_TYPES.contains(&manifest.config.media_type.as_str()) {
        return Err(ImageError::UnsupportedMediaType {
            image: image.into(),
            what: "config (is this an image, or another kind of artifact?)".into(),
            media_type: manifest.config.media_type.clone(),
        });
    }
    check_digest(image, "config", &manifest.config.digest)?;
    if manifest.config.size > MAX_JSON_BYTES {
        return Err(ImageError::TooLarge { image: image.into(), what: "config".into(), limit_bytes: MAX_JSON_BYTES });
    }
    if manifest.layers.len() > MAX_LAYERS {
        return Err(ImageError::BadManifest {
            image: image.into(),
            what: "manifest".into(),
            why: format!("{} layers (at most {MAX_LAYERS} are accepted)", manifest.layers.len()),
        });
    }
    for layer in &manifest.layers {
        check_digest(image, "layer", &layer.digest)?;
        if layer.size > MAX_LAYER_BYTES {
            return Err(ImageError::TooLarge {
                image: image.into(),
                what: format!("layer {}", layer.digest),
                limit_bytes: MAX_LAYER_BYTES,
            });
        }
    }
    Ok(())
}

/// The first message of a registry's JSON error answer (`{"errors":[{"code":..,"message":..}]}`), for the user.
fn error_detail(response: &mut ureq::http::Response<ureq::Body>) -> String {
    let Ok(body) = response.body_mut().with_config().limit(MAX_SMALL_BODY_BYTES).read_to_vec() else {
        return String::new();
    };
    let message = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| {
        let first = v.get("errors")?.get(0)?.clone();
        let code = first.get("code").and_then(|c| c.as_str()).unwrap_or("").to_string();
        let message = first.get("message").and_then(|m| m.as_str()).unwrap_or("").to_string();
        Some(format!("{code} {message}").trim().to_string())
    });
    match message {
        Some(m) if !m.is_empty() => format!(": {}", m.chars().take(300).collect::<String>()),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::container::ImageRef;

    fn registry_image(text: &str) -> RegistryImage {
        match ImageRef::parse(text).expect("parse") {
            ImageRef::Registry(r) => r,
            ImageRef::File(_) => panic!("not a registry image"),
        }
    }

    fn url_of(image: &RegistryImage, insecure: &[String]) -> String {
        let reference = match &image.reference {
            ImageTag::Tag(tag) => tag.as_str(),
            ImageTag::Digest(digest) => digest.as_str(),
        };
        manifest_url(&registry_base(&image.registry, insecure), &image.repository, reference)
    }

    #[test]
    fn references_map_to_urls() {
        let none: Vec<String> = Vec::new();
        assert_eq!(
            url_of(&registry_image("ubuntu"), &none),
            "https://registry-1.docker.io/v2/library/ubuntu/manifests/latest"
        );
        assert_eq!(
            url_of(&registry_image("nvcr.io#nvidia/pytorch:24.01-py3"), &none),
            "https://nvcr.io/v2/nvidia/pytorch/manifests/24.01-py3"
        );
        assert_eq!(
            url_of(&registry_image("127.0.0.1:5000#team/img:v1"), &none),
            "http://127.0.0.1:5000/v2/team/img/manifests/v1"
        );
        assert_eq!(url_of(&registry_image("localhost:5000/a/b:c"), &none), "http://localhost:5000/v2/a/b/manifests/c");
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            url_of(&registry_image(&format!("ghcr.io/o/r@{digest}")), &none),
            format!("https://ghcr.io/v2/o/r/manifests/{digest}")
        );
        let insecure = vec!["reg.lan:5000".to_string()];
        assert_eq!(url_of(&registry_image("reg.lan:5000/x:1"), &insecure), "http://reg.lan:5000/v2/x/manifests/1");
        assert_eq!(url_of(&registry_image("reg.lan:5001/x:1"), &insecure), "https://reg.lan:5001/v2/x/manifests/1");
        assert!(plain_http_allowed("[::1]:5000", &none) && plain_http_allowed("127.1.2.3", &none));
        assert!(!plain_http_allowed("10.0.0.1:5000", &none));
    }

    #[test]
    fn www_authenticate_is_parsed() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/ubuntu:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"bearer realm=https://nvcr.io/proxy_auth , scope="a,b""#),
            Some(Challenge::Bearer {
                realm: "https://nvcr.io/proxy_auth".into(),
                service: None,
                scope: Some("a,b".into())
            })
        );
        assert_eq!(parse_challenge(r#"Basic realm="Registry Realm""#), Some(Challenge::Basic));
        assert_eq!(parse_challenge("Basic"), Some(Challenge::Basic));
        assert_eq!(
            parse_challenge(r#"Bearer realm="a\"b""#),
            Some(Challenge::Bearer { realm: "a\"b".into(), service: None, scope: None })
        );
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(""), None);
        assert_eq!(percent_encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }

    #[test]
    fn manifests_are_told_apart_and_platforms_picked() {
        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1","size":1,"platform":{"architecture":"unknown","os":"unknown"}},
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2","size":1,"platform":{"architecture":"arm64","os":"linux","variant":"v8"}},
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:3","size":1,"platform":{"architecture":"amd64","os":"linux"}}]}"#;
        assert_eq!(manifest_kind("i", None, index).expect("kind"), ManifestKind::Index);
        let parsed: Index = serde_json::from_slice(index).expect("index");
        let chosen = pick_platform("i", &parsed).expect("platform");
        let expected = if host_platform().1 == "arm64" { "sha256:2" } else { "sha256:3" };
        assert_eq!(chosen.digest, expected);
        let none = Index { manifests: Vec::new() };
        assert!(pick_platform("i", &none).expect_err("none").to_string().contains("no variant for platform"));
        assert_eq!(
            manifest_kind("i", Some(DOCKER_MANIFEST), br#"{"schemaVersion":2,"layers":[]}"#).expect("m"),
            ManifestKind::Manifest
        );
        let schema1 = manifest_kind("i", None, br#"{"schemaVersion":1,"fsLayers":[]}"#).expect_err("schema 1");
        assert!(schema1.to_string().contains("schema 1"), "{schema1}");
        let helm = manifest_kind("i", Some("application/vnd.cncf.helm.chart"), br#"{"x":1}"#).expect_err("helm");
        assert!(helm.to_string().contains("unsupported media type"), "{helm}");
    }

    #[test]
    fn digests_and_layer_types_are_checked() {
        assert!(check_digest("i", "layer", &format!("sha256:{}", "0".repeat(64))).is_ok());
        for bad in ["sha256:../../etc", "sha512:abc", &format!("sha256:{}", "A".repeat(64))] {
            assert!(check_digest("i", "layer", bad).is_err(), "{bad}");
        }
        let layer = |t: &str| Descriptor { media_type: t.into(), digest: String::new(), size: 0, platform: None };
        assert!(check_layer_type("i", &layer("application/vnd.oci.image.layer.v1.tar+zstd")).is_ok());
        assert!(check_layer_type("i", &layer("application/vnd.in-toto+json")).is_err());
    }

    /// A one-purpose registry on a loopback port: manifests need a bearer token, which its realm hands out for
    /// alice's basic credentials. Answers `requests` connections, then stops.
    fn bearer_registry(requests: usize) -> (u16, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let handle = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for stream in listener.incoming().take(requests) {
                let mut stream = stream.expect("accept");
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut request_line = String::new();
                reader.read_line(&mut request_line).expect("request");
                let mut authorization = String::new();
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).expect("header");
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) =
                        line.strip_prefix("authorization: ").or_else(|| line.strip_prefix("Authorization: "))
                    {
                        authorization = v.trim().to_string();
                    }
                }
                let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                seen.push(format!("{path} [{authorization}]"));
                let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("alice:pw"));
                let manifest = format!(
                    r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{}","digest":"sha256:{}","size":2}},"layers":[]}}"#,
                    CONFIG_TYPES[0],
                    "0".repeat(64)
                );
                let (status, extra, body) = if path.starts_with("/token?") && authorization == basic {
                    ("200 OK", String::new(), r#"{"access_token":"tok"}"#.to_string())
                } else if path.starts_with("/token?") {
                    ("401 Unauthorized", String::new(), String::new())
                } else if authorization == "Bearer tok" {
                    ("200 OK", format!("Content-Type: {OCI_MANIFEST}\r\n"), manifest)
                } else {
                    let challenge = format!(
                        r#"WWW-Authenticate: Bearer realm="http://127.0.0.1:{port}/token",service="test",scope="repository:team/x:pull""#
                    );
                    ("401 Unauthorized", format!("{challenge}\r\n"), String::new())
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).expect("answer");
            }
            seen
        });
        (port, handle)
    }

    #[test]
    fn bearer_tokens_are_fetched_with_the_users_credentials() {
        let (port, server) = bearer_registry(3);
        let image = registry_image(&format!("127.0.0.1:{port}#team/x:v1"));
        let credentials = RegistryCredentials::from_netrc(&format!("machine 127.0.0.1:{port} login alice password pw"));
        let client = RegistryClient::new(&image, &credentials, &[], 5_000, Path::new("/nonexistent"));
        let resolved = client.resolve(&image.reference).expect("resolve");
        assert!(resolved.digest.starts_with("sha256:") && resolved.manifest.layers.is_empty());
        let seen = server.join().expect("server");
        assert_eq!(seen[0], "/v2/team/x/manifests/v1 []");
        assert!(seen[1].starts_with("/token?service=test&scope=repository%3Ateam%2Fx%3Apull [Basic "), "{seen:?}");
        assert_eq!(seen[2], "/v2/team/x/manifests/v1 [Bearer tok]");

        // Without credentials the token service refuses, and the error says where credentials go.
        let (port, server) = bearer_registry(2);
        let image = registry_image(&format!("127.0.0.1:{port}#team/x:v1"));
        let client = RegistryClient::new(&image, &RegistryCredentials::none(), &[], 5_000, Path::new("/nonexistent"));
        let error = client.resolve(&image.reference).err().expect("refused");
        assert!(matches!(error, ImageError::AccessDenied { status: 401, .. }), "{error}");
        assert!(error.to_string().contains(".config/enroot/.credentials"), "{error}");
        server.join().expect("server");
    }
}

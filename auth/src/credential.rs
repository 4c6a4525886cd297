//! User credentials in the spirit of MUNGE.
//!
//! Every host of a cluster holds the same secret [`ClusterKey`]. On each host, `drover-authd` asks the kernel who is
//! calling (SO_PEERCRED) and signs that identity into a short-lived token; any process holding the key (a
//! controller) can then check, without a round trip, that the token came from some host of this cluster and has not
//! been altered or outlived its TTL.
//!
//! Token format: `base64url(JSON claims) "." base64url(HMAC-SHA256(key, JSON claims))`, both without padding. The MAC
//! is over the exact JSON bytes that travel, so no canonical encoding is needed.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The gRPC metadata entry that carries a user's credential.
pub const CREDENTIAL_METADATA_KEY: &str = "x-drover-credential";
/// How long a credential lives by default: long enough for a CLI command that retries through a leader election,
/// short enough that a leaked token is soon worthless.
pub const DEFAULT_TTL_MS: u64 = 300_000;
/// How far in the future a token's issue time may lie before it is refused: hosts' clocks are never exactly equal.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;
/// The largest token `verify` will look at. Real tokens are ~300 bytes; the bound keeps a hostile peer from making
/// us decode megabytes.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The only claims format this version understands.
pub const CLAIMS_VERSION: u32 = 1;

const KEY_BYTES: usize = 32;
/// A key file is 64 hex digits and a newline; anything much bigger is not a key file.
const MAX_KEY_FILE_BYTES: u64 = 1024;

type HmacSha256 = Hmac<Sha256>;

/// The secret shared by every host of one cluster. Whoever holds it can mint credentials for any user, so it lives
/// in a mode-0600 file and is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_BYTES]);

/// Problems with the cluster key file. Each message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error(
        "cannot read cluster key {path}: {source} (create one with `drover-authd --key {path} --write-new-key` and copy it to every host)"
    )]
    Read { path: PathBuf, source: io::Error },
    #[error("cluster key {path} is readable or writable by group/other (mode {mode:04o}): chmod 600 {path}")]
    Insecure { path: PathBuf, mode: u32 },
    #[error("cluster key {path} is not 64 hex digits ({reason}): restore it from another host of the cluster")]
    BadFormat { path: PathBuf, reason: String },
    #[error(
        "{path} already exists: refusing to overwrite a cluster key (every credential depends on it); remove it first if you mean to replace it on every host"
    )]
    Exists { path: PathBuf },
    #[error("cannot write cluster key {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

impl ClusterKey {
    /// A new random key from the operating system's CSPRNG.
    ///
    /// # Panics
    /// If the OS random source fails: there is no safe key to return then.
    pub fn generate() -> ClusterKey {
        let mut bytes = [0u8; KEY_BYTES];
        getrandom::fill(&mut bytes).expect("the operating system's random source (getrandom) failed");
        ClusterKey(bytes)
    }

    /// Builds a key from raw bytes (tests, or keys kept in another store).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// Reads a key file: 64 hex digits, optionally followed by a newline. A file that group or others may read or
    /// write is refused, because anyone who can read it can impersonate every user.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyFileError> {
        let read_err = |source| KeyFileError::Read { path: path.to_owned(), source };
        let file = fs::File::open(path).map_err(read_err)?;
        let mode = file.metadata().map_err(read_err)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Insecure { path: path.to_owned(), mode: mode & 0o7777 });
        }
        let mut text = String::new();
        file.take(MAX_KEY_FILE_BYTES).read_to_string(&mut text).map_err(read_err)?;
        let bad = |reason: String| KeyFileError::BadFormat { path: path.to_owned(), reason };
        let hex = text.strip_suffix('\n').unwrap_or(&text);
        let hex = hex.strip_suffix('\r').unwrap_or(hex);
        if hex.len() != 2 * KEY_BYTES {
            return Err(bad(format!("found {} characters", hex.len())));
        }
        decode_hex(hex).map(ClusterKey).ok_or_else(|| bad("found a character that is not a hex digit".into()))
    }

    /// Writes this key to a new file with mode 0600. Fails if the file exists: overwriting a cluster key silently
    /// would lock every other host out.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyFileError> {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                KeyFileError::Exists { path: path.to_owned() }
            } else {
                KeyFileError::Write { path: path.to_owned(), source }
            }
        })?;
        let write_err = |source| KeyFileError::Write { path: path.to_owned(), source };
        // The umask cannot widen 0600, but an inherited ACL could; set the mode explicitly.
        file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(write_err)?;
        let mut text = encode_hex(&self.0);
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(write_err)?;
        file.sync_all().map_err(write_err)
    }

    /// A short, non-secret fingerprint, so operators can compare keys across hosts without revealing them.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::new().chain_update(b"drover-cluster-key-fingerprint\0").chain_update(self.0).finalize();
        encode_hex(&digest[..6])
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail for a 32-byte key.
        <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC-SHA256 accepts a 32-byte key")
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey(fingerprint {})", self.fingerprint())
    }
}

/// Who a user is, as the kernel of the issuing host saw them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub user: String,
}

/// What a credential asserts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Format version, [`CLAIMS_VERSION`].
    pub version: u32,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    /// The host whose authd issued the token.
    pub host: String,
    /// Milliseconds since the Unix epoch, on the issuer's clock.
    pub issued_ms: u64,
    pub expires_ms: u64,
    /// Random, so two tokens issued in the same millisecond differ (a verifier may use it to refuse replays).
    pub nonce: u64,
    /// Who may accept it: empty for the controllers (what `drover-authd` issues), or [`step_audience`] for the
    /// agents of one job step (what the controllers issue to `srun`). A token a node received can therefore never
    /// be replayed to the controllers, nor to a step it was not issued for.
    #[serde(default)]
    pub audience: String,
}

impl Claims {
    pub fn identity(&self) -> Identity {
        Identity { uid: self.uid, gid: self.gid, user: self.user.clone() }
    }
}

/// Why a credential was refused. Messages say what the operator or user should do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("malformed credential ({reason}): get a fresh one from drover-authd")]
    Malformed { reason: String },
    #[error(
        "credential not signed with this cluster's key: the host that issued it has a different cluster key (compare `drover-authd` key fingerprints in its log; copy the cluster's key file there)"
    )]
    BadSignature,
    #[error(
        "credential expired {ago_ms} ms ago: get a fresh one from drover-authd (if it was issued just now, this host's clock is behind the issuer's: run NTP)"
    )]
    Expired { ago_ms: u64 },
    #[error(
        "credential issued {ahead_ms} ms in the future: clocks differ by more than {} s: run NTP on both hosts",
        MAX_CLOCK_SKEW_MS / 1000
    )]
    NotYetValid { ahead_ms: u64 },
    #[error(
        "credential issued for {} but presented to {}: a credential is good only where it was meant to go (srun gets one per step from the controllers; upgrade an older srun)",
        describe_audience(found),
        describe_audience(expected)
    )]
    WrongAudience { found: String, expected: String },
    #[error(
        "credential format version {found} is unknown (this build understands version {CLAIMS_VERSION}): upgrade drover on this host to match the issuer's"
    )]
    UnknownVersion { found: u32 },
}

/// The audience of the credential that lets `srun` launch step `step` of job `job` on the job's nodes.
pub fn step_audience(job: u64, step: u32) -> String {
    format!("step:{job}.{step}")
}

/// Signs `identity` into a token for the controllers, valid from `now_ms` for `ttl_ms`.
pub fn sign(key: &ClusterKey, identity: &Identity, host: &str, now_ms: u64, ttl_ms: u64) -> String {
    sign_for(key, identity, host, now_ms, ttl_ms, "")
}

/// Signs `identity` into a token only `audience` accepts (see [`Claims::audience`]).
pub fn sign_for(key: &ClusterKey, identity: &Identity, host: &str, now_ms: u64, ttl_ms: u64, audience: &str) -> String {
    let claims = Claims {
        version: CLAIMS_VERSION,
        uid: identity.uid,
        gid: identity.gid,
        user: identity.user.clone(),
        host: host.to_owned(),
        issued_ms: now_ms,
        expires_ms: now_ms.saturating_add(ttl_ms),
        nonce: getrandom::u64().expect("the operating system's random source (getrandom) failed"),
        audience: audience.to_owned(),
    };
    // A struct of integers and strings always serializes.
    let payload = serde_json::to_vec(&claims).expect("claims serialize to JSON");
    let tag = key.mac().chain_update(&payload).finalize().into_bytes();
    format!("{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(tag))
}

/// Reads a token's claims WITHOUT checking its signature: for a client deciding when its own token needs
/// refreshing, never for deciding who someone is.
pub fn unverified_claims(token: &str) -> Option<Claims> {
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let (payload, _) = token.split_once('.')?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// Checks a token's signature (in constant time), version and validity window at `now_ms`.
pub fn verify(key: &ClusterKey, token: &str, now_ms: u64) -> Result<Claims, CredentialError> {
    let malformed = |reason: &str| CredentialError::Malformed { reason: reason.to_owned() };
    if token.len() > MAX_TOKEN_BYTES {
        return Err(CredentialError::Malformed {
            reason: format!("{} bytes, over the {MAX_TOKEN_BYTES}-byte limit", token.len()),
        });
    }
    let (payload_b64, tag_b64) = token.split_once('.').ok_or_else(|| malformed("no '.' separator"))?;
    let payload = URL_SAFE_NO_PAD.decode(payload_b64).map_err(|_| malformed("claims are not base64url"))?;
    let tag = URL_SAFE_NO_PAD.decode(tag_b64).map_err(|_| malformed("signature is not base64url"))?;
    // Authenticate before parsing: nothing unauthenticated reaches the JSON parser's interpretation.
    key.mac().chain_update(&payload).verify_slice(&tag).map_err(|_| CredentialError::BadSignature)?;

    // Read the version first, so a future format reads as "unknown version" rather than "malformed".
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let versioned: Versioned = serde_json::from_slice(&payload).map_err(|_| malformed("claims are not JSON"))?;
    if versioned.version != CLAIMS_VERSION {
        return Err(CredentialError::UnknownVersion { found: versioned.version });
    }
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| malformed("claims lack a field"))?;
    if claims.issued_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
        return Err(CredentialError::NotYetValid { ahead_ms: claims.issued_ms - now_ms });
    }
    if now_ms >= claims.expires_ms {
        return Err(CredentialError::Expired { ago_ms: now_ms - claims.expires_ms });
    }
    Ok(claims)
}

fn describe_audience(audience: &str) -> String {
    match audience.strip_prefix("step:") {
        Some(step) => format!("job step {step}"),
        None if audience.is_empty() => "the controllers".to_string(),
        None => format!("{audience:?}"),
    }
}

/// Refuses claims meant for another audience than `expected` (see [`Claims::audience`]).
pub fn check_audience(claims: &Claims, expected: &str) -> Result<(), CredentialError> {
    if claims.audience == expected {
        return Ok(());
    }
    Err(CredentialError::WrongAudience { found: claims.audience.clone(), expected: expected.to_owned() })
}

/// The message a server returns when a request carries no credential at all.
pub const MISSING_CREDENTIAL: &str =
    "no user credential: the client must get one from drover-authd on its host (its socket: DROVER_AUTH_SOCKET)";

/// Reads and verifies the credential a request carries. Every failure is `unauthenticated`, with a message the
/// user can act on.
pub fn identity_from_request<T>(
    key: &ClusterKey,
    req: &tonic::Request<T>,
    now_ms: u64,
) -> Result<Claims, tonic::Status> {
    let value = req
        .metadata()
        .get(CREDENTIAL_METADATA_KEY)
        .ok_or_else(|| tonic::Status::unauthenticated(MISSING_CREDENTIAL))?;
    let token = value.to_str().map_err(|_| {
        tonic::Status::unauthenticated(
            CredentialError::Malformed { reason: "metadata value is not ASCII".into() }.to_string(),
        )
    })?;
    verify(key, token, now_ms).map_err(|err| tonic::Status::unauthenticated(err.to_string()))
}

/// Puts a token (from [`crate::authd::fetch`]) on an outgoing request.
pub fn attach_credential<T>(req: &mut tonic::Request<T>, token: &str) -> Result<(), CredentialError> {
    let value = tonic::metadata::MetadataValue::try_from(token)
        .map_err(|_| CredentialError::Malformed { reason: "token is not valid metadata".into() })?;
    req.metadata_mut().insert(CREDENTIAL_METADATA_KEY, value);
    Ok(())
}

pub use drover_common::wall::now_ms;

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(hex: &str) -> Option<[u8; KEY_BYTES]> {
    let digits = hex.as_bytes();
    if digits.len() != 2 * KEY_BYTES {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; KEY_BYTES];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn alice() -> Identity {
        Identity { uid: 1000, gid: 100, user: "alice".into() }
    }

    fn key() -> ClusterKey {
        ClusterKey::from_bytes([7; 32])
    }

    /// Issue 28, finding 12: a token a node received for a step is good for that step only, never at the
    /// controllers; and one from authd (for the controllers) is no good for a step.
    #[test]
    fn a_credential_is_accepted_only_by_its_audience() {
        let step = sign_for(&key(), &alice(), "ctl1", NOW, DEFAULT_TTL_MS, &step_audience(12, 3));
        let claims = verify(&key(), &step, NOW).unwrap();
        assert!(check_audience(&claims, &step_audience(12, 3)).is_ok());
        let err = check_audience(&claims, "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "credential issued for job step 12.3 but presented to the controllers: a credential is good only where it was meant to go (srun gets one per step from the controllers; upgrade an older srun)"
        );
        assert!(check_audience(&claims, &step_audience(12, 4)).is_err(), "another step of the same job");
        let plain = verify(&key(), &sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS), NOW).unwrap();
        assert!(check_audience(&plain, "").is_ok());
        assert!(check_audience(&plain, &step_audience(12, 3)).is_err());
        // The audience is signed: changing it breaks the signature.
        let (payload, tag) = step.split_once('.').unwrap();
        let json = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let forged = URL_SAFE_NO_PAD.encode(json.replace("step:12.3", ""));
        assert_eq!(verify(&key(), &format!("{forged}.{tag}"), NOW).unwrap_err(), CredentialError::BadSignature);
    }

    #[test]
    fn a_signed_credential_verifies_and_carries_the_identity() {
        let token = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        let claims = verify(&key(), &token, NOW + 1000).expect("fresh token verifies");
        assert_eq!(claims.identity(), alice());
        assert_eq!(claims.host, "node1");
        assert_eq!(claims.version, CLAIMS_VERSION);
        assert_eq!(claims.issued_ms, NOW);
        assert_eq!(claims.expires_ms, NOW + DEFAULT_TTL_MS);
    }

    #[test]
    fn two_tokens_for_the_same_user_in_the_same_millisecond_differ() {
        let a = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        let b = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        assert_ne!(a, b, "the nonce makes each token unique");
    }

    #[test]
    fn a_user_who_edits_the_claims_to_become_root_is_refused() {
        let token = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        let (payload, tag) = token.split_once('.').unwrap();
        let json = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let forged = json.replace("\"uid\":1000", "\"uid\":0");
        assert_ne!(forged, json);
        let forged_token = format!("{}.{tag}", URL_SAFE_NO_PAD.encode(forged));
        assert_eq!(verify(&key(), &forged_token, NOW), Err(CredentialError::BadSignature));
    }

    #[test]
    fn a_token_with_a_damaged_signature_is_refused() {
        let token = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        let (payload, tag) = token.split_once('.').unwrap();
        let mut tag = URL_SAFE_NO_PAD.decode(tag).unwrap();
        tag[0] ^= 1;
        let damaged = format!("{payload}.{}", URL_SAFE_NO_PAD.encode(&tag));
        assert_eq!(verify(&key(), &damaged, NOW), Err(CredentialError::BadSignature));
        let truncated = format!("{payload}.{}", URL_SAFE_NO_PAD.encode(&tag[..16]));
        assert_eq!(verify(&key(), &truncated, NOW), Err(CredentialError::BadSignature));
    }

    #[test]
    fn a_token_from_a_host_with_another_key_is_refused_with_a_hint_about_keys() {
        let token = sign(&ClusterKey::generate(), &alice(), "rogue", NOW, DEFAULT_TTL_MS);
        let err = verify(&key(), &token, NOW).unwrap_err();
        assert_eq!(err, CredentialError::BadSignature);
        assert!(err.to_string().contains("different cluster key"), "{err}");
    }

    #[test]
    fn an_expired_token_says_how_long_ago_it_expired() {
        let token = sign(&key(), &alice(), "node1", NOW, 1000);
        assert!(verify(&key(), &token, NOW + 999).is_ok());
        assert_eq!(verify(&key(), &token, NOW + 1000), Err(CredentialError::Expired { ago_ms: 0 }));
        assert_eq!(verify(&key(), &token, NOW + 6000), Err(CredentialError::Expired { ago_ms: 5000 }));
    }

    #[test]
    fn a_token_from_a_host_whose_clock_runs_ahead_is_tolerated_up_to_the_skew_limit() {
        let token = sign(&key(), &alice(), "fast-clock", NOW + MAX_CLOCK_SKEW_MS, DEFAULT_TTL_MS);
        assert!(verify(&key(), &token, NOW).is_ok());
        let token = sign(&key(), &alice(), "fast-clock", NOW + MAX_CLOCK_SKEW_MS + 1, DEFAULT_TTL_MS);
        let err = verify(&key(), &token, NOW).unwrap_err();
        assert_eq!(err, CredentialError::NotYetValid { ahead_ms: MAX_CLOCK_SKEW_MS + 1 });
        assert!(err.to_string().contains("run NTP"), "{err}");
    }

    #[test]
    fn oversized_and_garbled_tokens_are_malformed_not_panics() {
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(matches!(verify(&key(), &huge, NOW), Err(CredentialError::Malformed { .. })));
        for garbage in ["", ".", "no-dot", "!!!.!!!", "a.b.c", "é.é"] {
            let result = verify(&key(), garbage, NOW);
            assert!(
                matches!(result, Err(CredentialError::Malformed { .. }) | Err(CredentialError::BadSignature)),
                "{garbage:?} gave {result:?}"
            );
        }
    }

    #[test]
    fn a_correctly_signed_token_of_a_future_format_reports_its_version() {
        let payload = br#"{"version":2,"anything":"new"}"#;
        let tag = key().mac().chain_update(payload).finalize().into_bytes();
        let token = format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(tag));
        assert_eq!(verify(&key(), &token, NOW), Err(CredentialError::UnknownVersion { found: 2 }));
    }

    #[test]
    fn a_server_reads_the_credential_from_request_metadata() {
        let token = sign(&key(), &alice(), "node1", NOW, DEFAULT_TTL_MS);
        let mut req = tonic::Request::new(());
        attach_credential(&mut req, &token).unwrap();
        let claims = identity_from_request(&key(), &req, NOW).unwrap();
        assert_eq!(claims.user, "alice");
    }

    #[test]
    fn a_request_without_a_credential_is_told_where_to_get_one() {
        let status = identity_from_request(&key(), &tonic::Request::new(()), NOW).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("DROVER_AUTH_SOCKET"), "{}", status.message());
    }

    #[test]
    fn a_request_with_a_bad_credential_is_unauthenticated_with_the_reason() {
        let mut req = tonic::Request::new(());
        let token = sign(&key(), &alice(), "node1", NOW, 10);
        attach_credential(&mut req, &token).unwrap();
        let status = identity_from_request(&key(), &req, NOW + 20).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("expired"), "{}", status.message());
    }

    #[test]
    fn a_key_written_to_a_file_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let key = ClusterKey::generate();
        key.write_new(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ClusterKey::load(&path).unwrap(), key);
    }

    #[test]
    fn an_existing_key_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        ClusterKey::generate().write_new(&path).unwrap();
        let err = ClusterKey::generate().write_new(&path).unwrap_err();
        assert!(matches!(err, KeyFileError::Exists { .. }), "{err}");
    }

    #[test]
    fn a_key_file_others_can_read_is_refused_with_the_chmod_to_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        ClusterKey::generate().write_new(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err();
        assert!(err.to_string().contains(&format!("chmod 600 {}", path.display())), "{err}");
    }

    #[test]
    fn a_key_file_with_the_wrong_contents_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        for contents in ["abc\n", &"zz".repeat(32), &"ab".repeat(33)] {
            let _ = fs::remove_file(&path);
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
            fs::write(&path, contents).unwrap();
            let err = ClusterKey::load(&path).unwrap_err();
            assert!(matches!(err, KeyFileError::BadFormat { .. }), "{contents:?}: {err}");
        }
        // No trailing newline is fine too.
        fs::write(&path, "ab".repeat(32)).unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap(), ClusterKey::from_bytes([0xab; 32]));
    }

    #[test]
    fn debug_output_shows_a_fingerprint_never_the_key() {
        let key = ClusterKey::from_bytes([0xab; 32]);
        let shown = format!("{key:?}");
        assert!(!shown.contains("abab"), "{shown}");
        assert!(shown.contains(&key.fingerprint()));
    }
}

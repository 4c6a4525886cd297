//! `drover-authd`: hands each local user a credential for *their own* identity.
//!
//! The daemon listens on a Unix socket that any local user may open. For each connection it asks the kernel who is
//! on the other end (SO_PEERCRED: the uid and gid the kernel recorded at connect time, not anything the caller
//! says), signs that identity with the cluster key, writes the token and a newline, and closes. The caller never
//! sends anything; whatever it does send is ignored.

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::credential::{self, ClusterKey, Identity};

/// Where authd listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/drover/auth.sock";
/// The environment variable clients read to find authd's socket.
pub const SOCKET_ENV: &str = "DROVER_AUTH_SOCKET";
/// Connections served at once; more wait in the kernel's backlog. Signing takes microseconds, so 64 only binds when
/// something is wrong (a slow name service, a flood), and then it keeps the daemon's memory flat.
pub const MAX_CONCURRENT_CONNECTIONS: usize = 64;
/// Per connection, all included (name lookup, write). A client that does not read its token is dropped after this.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest reply `fetch` accepts, matching the longest token `verify` accepts.
pub const MAX_REPLY_BYTES: usize = credential::MAX_TOKEN_BYTES;

/// The socket path from `DROVER_AUTH_SOCKET`, or [`DEFAULT_SOCKET`].
pub fn socket_path_from_env() -> PathBuf {
    std::env::var_os(SOCKET_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Binds authd's socket, ready for [`serve`]. Must be called inside a tokio runtime.
///
/// Creates the parent directory; replaces a socket file left by a dead authd, but refuses (AddrInUse) when a live
/// one answers on it; makes the socket mode 0666 so every local user can ask for their own credential.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    bind_public_socket(path, "drover-authd")
}

/// Binds a host daemon's Unix socket open to every local user (mode 0666), replacing a stale socket file a
/// dead predecessor left, and refusing when `daemon` (its name, for the messages) still serves it or the path is
/// not a socket. For daemons whose callers prove who they are some other way (the kernel's peer credentials,
/// a signed credential), never by the file mode.
pub fn bind_public_socket(path: &Path, daemon: &str) -> io::Result<UnixListener> {
    let with_path =
        |err: io::Error, what: &str| io::Error::new(err.kind(), format!("{what} {}: {err}", path.display()));
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| with_path(e, "cannot create the directory of"))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket: remove it or choose another --socket", path.display()),
            ));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another {daemon} is serving {}: stop it first, or choose another --socket",
                        path.display()
                    ),
                ));
            }
            // Nobody listens: a previous authd died without cleaning up. Its file would make bind fail.
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(socket = %path.display(), "removing a stale socket left by a previous {daemon}");
                std::fs::remove_file(path).map_err(|e| with_path(e, "cannot remove the stale socket"))?;
            }
            Err(err) => return Err(with_path(err, &format!("cannot check whether another {daemon} serves"))),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(with_path(err, "cannot inspect")),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| with_path(e, "cannot bind"))?;
    // Open to all on purpose: the kernel, not the file mode, decides whose credential a caller gets.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| with_path(e, "cannot chmod 0666"))?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// Serves credentials on `listener` until the task is dropped or aborted.
pub async fn serve(listener: UnixListener, key: ClusterKey, ttl_ms: u64) {
    let key = Arc::new(key);
    let host: Arc<str> = hostname().into();
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_CONNECTIONS));
    tracing::info!(host = %host, key = %key.fingerprint(), ttl_ms, "drover-authd serving");
    loop {
        // Take a slot before accepting, so under a flood connections wait in the kernel's backlog, not in our memory.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Usually EMFILE/ENFILE: back off instead of spinning on an error that will repeat.
                tracing::warn!(error = %err, "drover-authd: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (key, host) = (key.clone(), host.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_TIMEOUT, issue(stream, &key, &host, ttl_ms)).await {
                Ok(Ok(())) => {}
                // A client that hangs up before reading (a liveness probe, a killed CLI) is its own business.
                Ok(Err(err)) if matches!(err.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                    tracing::debug!(error = %err, "a client hung up before reading its credential")
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "drover-authd: could not issue a credential"),
                Err(_) => tracing::warn!(
                    timeout_ms = CONNECTION_TIMEOUT.as_millis() as u64,
                    "drover-authd: a connection took too long (a client not reading, or a slow name service); dropped it"
                ),
            }
            drop(slot);
        });
    }
}

async fn issue(mut stream: UnixStream, key: &ClusterKey, host: &str, ttl_ms: u64) -> io::Result<()> {
    let cred = stream.peer_cred()?;
    let (uid, gid) = (cred.uid(), cred.gid());
    // getpwuid_r may go to LDAP/SSSD over the network: keep it off the async workers.
    let user = tokio::task::spawn_blocking(move || user_name(uid)).await.map_err(io::Error::other)?;
    let token = credential::sign(key, &Identity { uid, gid, user: user.clone() }, host, credential::now_ms(), ttl_ms);
    // One write: the client reads up to the newline, and a second write would wake it twice.
    let mut line = token.into_bytes();
    line.push(b'\n');
    stream.write_all(&line).await?;
    stream.shutdown().await?;
    tracing::debug!(uid, gid, user = %user, pid = ?cred.pid(), "issued a credential");
    Ok(())
}

/// The user name of `uid` from the system's user database, or the uid as a string for a user without an entry
/// (containers often run with uids that /etc/passwd does not know).
pub fn user_name(uid: u32) -> String {
    // Grow the buffer on ERANGE, up to a bound, rather than trusting sysconf's hint (which may be -1).
    let mut size = 1024usize;
    while size <= 1 << 20 {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: all-zero is a valid `passwd` (null pointers and zero ids); getpwuid_r fills it.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, and `buf` has the length we pass.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == libc::ERANGE {
            size *= 2;
            continue;
        }
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            break;
        }
        // SAFETY: on success pw_name points to a NUL-terminated string inside `buf`, which is still alive.
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        return name.to_string_lossy().into_owned();
    }
    uid.to_string()
}

/// This machine's host name (from gethostname), or "localhost" if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname truncates rather than overflows.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}

/// Why a client could not get its credential. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("no drover-authd at {}: start it (drover local up starts one) or set {SOCKET_ENV}", path.display())]
    NoDaemon { path: PathBuf },
    #[error("drover-authd at {} is not running (a stale socket): start it (drover local up starts one)", path.display())]
    NotRunning { path: PathBuf },
    #[error(
        "cannot open {}: permission denied: its directory must be searchable by all and the socket mode 0666 (drover-authd sets the socket's mode)",
        path.display()
    )]
    PermissionDenied { path: PathBuf },
    #[error("drover-authd at {} did not answer within {timeout:?}: check its log (journalctl -u drover-authd)", path.display())]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("cannot talk to drover-authd at {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("drover-authd at {} sent an unexpected reply ({reason}): is that socket really drover-authd's?", path.display())]
    Protocol { path: PathBuf, reason: String },
}

/// Asks the authd at `socket` for a credential for the calling user. Blocking; a CLI calls it once per process.
pub fn fetch(socket: &Path, timeout: Duration) -> Result<String, FetchError> {
    let path = || socket.to_owned();
    // Connecting to a Unix socket never waits on a network, so only reads need the timeout.
    let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => FetchError::NoDaemon { path: path() },
        io::ErrorKind::ConnectionRefused => FetchError::NotRunning { path: path() },
        io::ErrorKind::PermissionDenied => FetchError::PermissionDenied { path: path() },
        _ => FetchError::Io { path: path(), source },
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(|source| FetchError::Io { path: path(), source })?;
    let mut line = Vec::new();
    // One byte over the limit tells "too long" apart from "exactly the limit".
    let mut reader = BufReader::new(stream.take(MAX_REPLY_BYTES as u64 + 2));
    reader.read_until(b'\n', &mut line).map_err(|source| match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FetchError::Timeout { path: path(), timeout },
        _ => FetchError::Io { path: path(), source },
    })?;
    let protocol = |reason: &str| FetchError::Protocol { path: path(), reason: reason.to_owned() };
    let Some(body) = line.strip_suffix(b"\n") else {
        return Err(if line.len() > MAX_REPLY_BYTES { protocol("reply too long") } else { protocol("no newline") });
    };
    let token = std::str::from_utf8(body).map_err(|_| protocol("not UTF-8"))?;
    if token.is_empty() || token.len() > MAX_REPLY_BYTES {
        return Err(protocol("empty or over-long token"));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::verify;

    const CHILD_SOCKET_ENV: &str = "DROVER_AUTH_TEST_CHILD_SOCKET";

    fn serve_in_background(path: &Path, key: &ClusterKey) -> tokio::task::JoinHandle<()> {
        let listener = bind(path).expect("bind");
        tokio::spawn(serve(listener, key.clone(), credential::DEFAULT_TTL_MS))
    }

    async fn fetch_async(path: &Path) -> Result<String, FetchError> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || fetch(&path, Duration::from_secs(5))).await.unwrap()
    }

    #[tokio::test]
    async fn a_user_gets_a_credential_naming_the_uid_the_kernel_reports() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/drover/auth.sock");
        let key = ClusterKey::generate();
        let server = serve_in_background(&path, &key);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o666);

        let token = fetch_async(&path).await.expect("fetch");
        let claims = verify(&key, &token, credential::now_ms()).expect("verifies with the cluster key");
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!((claims.uid, claims.gid), (uid, gid));
        assert_eq!(claims.user, user_name(uid));
        assert_eq!(claims.host, hostname());
        server.abort();
    }

    #[tokio::test]
    async fn a_socket_left_by_a_dead_authd_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // the file stays, nobody listens
        assert!(matches!(fetch(&path, Duration::from_secs(1)), Err(FetchError::NotRunning { .. })));

        let key = ClusterKey::generate();
        let server = serve_in_background(&path, &key);
        let token = fetch_async(&path).await.expect("the new authd answers");
        assert!(verify(&key, &token, credential::now_ms()).is_ok());
        server.abort();
    }

    #[tokio::test]
    async fn a_second_authd_on_a_live_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.sock");
        let server = serve_in_background(&path, &ClusterKey::generate());
        let err = bind(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("another drover-authd"), "{err}");
        server.abort();
    }

    #[test]
    fn a_regular_file_in_the_sockets_place_is_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.sock");
        std::fs::write(&path, "precious").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = runtime.block_on(async { bind(&path).unwrap_err() });
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    }

    #[test]
    fn a_missing_socket_tells_the_user_how_to_start_authd() {
        let dir = tempfile::tempdir().unwrap();
        let err = fetch(&dir.path().join("nope.sock"), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, FetchError::NoDaemon { .. }));
        let msg = err.to_string();
        assert!(msg.contains("nope.sock") && msg.contains("drover local up") && msg.contains(SOCKET_ENV), "{msg}");
    }

    #[test]
    fn a_server_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mute.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap(); // accepts (backlog) but never writes
        let err = fetch(&path, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, FetchError::Timeout { .. }), "{err}");
    }

    #[test]
    fn unknown_uids_are_named_by_number() {
        assert_eq!(user_name(4_000_000_123), "4000000123");
        assert_eq!(user_name(0), "root");
    }

    /// Run as a child of [`the_credential_names_the_kernels_uid_even_for_another_user`]: fetches and prints a token.
    /// Without the environment variable (an ordinary test run) it does nothing.
    #[test]
    fn child_fetch_helper() {
        if let Some(socket) = std::env::var_os(CHILD_SOCKET_ENV) {
            match fetch(Path::new(&socket), Duration::from_secs(5)) {
                // On a line of its own: the harness prints "test NAME ... " just before.
                Ok(token) => println!("\nTOKEN={token}"),
                Err(err) => println!("FETCH-ERROR={err}"),
            }
        }
    }

    /// As root, start a process as uid 60123 and let it ask for a credential: the token names 60123 because the
    /// kernel says so, whatever the process might claim.
    #[tokio::test]
    async fn the_credential_names_the_kernels_uid_even_for_another_user() {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can start a process as another uid");
            return;
        }
        const UID: u32 = 60123;
        let dir = tempfile::tempdir().unwrap();
        // The child must reach the socket and run a copy of this test binary, whatever the modes above us are.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.path().join("auth-tests");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("auth.sock");
        let key = ClusterKey::generate();
        let server = serve_in_background(&path, &key);

        let mut child = std::process::Command::new(&exe);
        child
            .args(["--exact", "authd::tests::child_fetch_helper", "--nocapture", "--test-threads=1"])
            .env(CHILD_SOCKET_ENV, &path)
            .current_dir(dir.path())
            .uid(UID)
            .gid(UID);
        let output = match tokio::task::spawn_blocking(move || child.output()).await.unwrap() {
            Ok(output) => output,
            Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
                eprintln!("skipped: cannot switch uid here (no CAP_SETUID?): {err}");
                server.abort();
                return;
            }
            Err(err) => panic!("cannot start the child: {err}"),
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let token = stdout
            .lines()
            .find_map(|l| l.split_once("TOKEN=").map(|(_, token)| token.trim()))
            .unwrap_or_else(|| panic!("child printed no token: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
        let claims = verify(&key, token, credential::now_ms()).unwrap();
        assert_eq!((claims.uid, claims.gid), (UID, UID));
        assert_eq!(claims.user, user_name(UID));
        server.abort();
    }
}

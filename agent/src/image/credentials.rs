//! Registry credentials, read from the job's user's own files (enroot's `~/.config/enroot/.credentials`, a netrc,
//! and docker's `~/.docker/config.json`), so a user can only ever pull what their own secrets allow.

use std::io::Read;
use std::path::Path;

use base64::Engine;

/// Largest credentials file read: real ones hold a few lines.
const MAX_CREDENTIALS_FILE_BYTES: u64 = 1024 * 1024;
/// Most entries kept from all files together.
const MAX_CREDENTIALS: usize = 1024;

/// One login for one registry host.
#[derive(Clone, PartialEq, Eq)]
struct Credential {
    host: String,
    login: String,
    password: String,
}

/// The logins a user has for registries. `Debug` shows the hosts only, never a login or a secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryCredentials {
    /// In file order, enroot's file first: the first match wins, as in enroot.
    entries: Vec<Credential>,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials").field("hosts", &self.hosts()).finish()
    }
}

impl RegistryCredentials {
    /// Anonymous access only.
    pub fn none() -> Self {
        RegistryCredentials::default()
    }

    /// Reads `HOME/.config/enroot/.credentials` and `HOME/.docker/config.json`. A missing or unreadable file means no
    /// credentials from it (logged): an anonymous pull may still work, and a refusal names the files to check. The
    /// caller runs this as the job's user, so the user's own permissions decide what is read.
    pub fn load(home: &Path) -> Self {
        let mut credentials = RegistryCredentials::none();
        let netrc = home.join(".config/enroot/.credentials");
        if let Some(text) = read_small(&netrc) {
            credentials.entries.extend(parse_netrc(&text));
        }
        let docker = home.join(".docker/config.json");
        if let Some(text) = read_small(&docker) {
            credentials.entries.extend(parse_docker_config(&text));
        }
        credentials.entries.truncate(MAX_CREDENTIALS);
        credentials
    }

    /// Builds credentials from enroot's netrc text (tests and callers that hold the text already).
    pub fn from_netrc(text: &str) -> Self {
        let mut entries = parse_netrc(text);
        entries.truncate(MAX_CREDENTIALS);
        RegistryCredentials { entries }
    }

    /// Builds credentials from a docker `config.json`'s text.
    pub fn from_docker_config(text: &str) -> Self {
        let mut entries = parse_docker_config(text);
        entries.truncate(MAX_CREDENTIALS);
        RegistryCredentials { entries }
    }

    /// The hosts some login is known for (what `Debug` shows).
    pub fn hosts(&self) -> Vec<&str> {
        self.entries.iter().map(|c| c.host.as_str()).collect()
    }

    /// `(login, password)` for `registry` (`nvcr.io`, `127.0.0.1:5000`, `docker.io`); with `user` (enroot's `USER@`
    /// prefix), only that login. Docker Hub's credentials may be filed under any of its names.
    pub fn for_registry(&self, registry: &str, user: Option<&str>) -> Option<(String, String)> {
        let wanted = normalize_host(registry);
        let names: Vec<String> = if is_docker_hub(&wanted) {
            ["docker.io", "registry-1.docker.io", "index.docker.io", "auth.docker.io"].map(String::from).to_vec()
        } else {
            vec![wanted]
        };
        self.entries
            .iter()
            .filter(|c| names.contains(&c.host))
            .find(|c| user.is_none_or(|u| c.login == u))
            .map(|c| (c.login.clone(), c.password.clone()))
    }
}

fn is_docker_hub(host: &str) -> bool {
    matches!(host, "docker.io" | "registry-1.docker.io" | "index.docker.io" | "auth.docker.io")
}

/// `https://index.docker.io/v1/` and `nvcr.io` name hosts the same way: scheme and path dropped, lower case.
fn normalize_host(text: &str) -> String {
    let text = text.trim();
    let text = text.strip_prefix("https://").or_else(|| text.strip_prefix("http://")).unwrap_or(text);
    let host = text.split('/').next().unwrap_or("");
    host.to_ascii_lowercase()
}

/// Reads at most [`MAX_CREDENTIALS_FILE_BYTES`]; `None` when absent or unreadable.
fn read_small(path: &Path) -> Option<String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read registry credentials file");
            return None;
        }
    };
    let mut text = String::new();
    if let Err(e) = file.take(MAX_CREDENTIALS_FILE_BYTES).read_to_string(&mut text) {
        tracing::warn!(path = %path.display(), error = %e, "cannot read registry credentials file");
        return None;
    }
    Some(text)
}

/// netrc: whitespace-separated `machine HOST login USER password PASS` groups (enroot's file; `$oauthtoken` is an
/// ordinary login there). `#` starts a comment line. Enroot's shell expansion of values (`$(cmd)`) is not done: it
/// would run the user's commands as root.
fn parse_netrc(text: &str) -> Vec<Credential> {
    let mut out = Vec::new();
    let mut tokens = text.lines().filter(|l| !l.trim_start().starts_with('#')).flat_map(str::split_whitespace);
    let mut current: Option<(String, Option<String>, Option<String>)> = None;
    let flush = |current: &mut Option<(String, Option<String>, Option<String>)>, out: &mut Vec<Credential>| {
        if let Some((host, Some(login), Some(password))) = current.take() {
            out.push(Credential { host: normalize_host(&host), login, password });
        }
    };
    while let Some(token) = tokens.next() {
        match token {
            "machine" => {
                flush(&mut current, &mut out);
                if let Some(host) = tokens.next() {
                    current = Some((host.to_string(), None, None));
                }
            }
            "default" => flush(&mut current, &mut out),
            "login" => {
                if let (Some(entry), Some(value)) = (current.as_mut(), tokens.next()) {
                    entry.1 = Some(value.to_string());
                }
            }
            "password" => {
                if let (Some(entry), Some(value)) = (current.as_mut(), tokens.next()) {
                    entry.2 = Some(value.to_string());
                }
            }
            _ => {}
        }
        if out.len() >= MAX_CREDENTIALS {
            break;
        }
    }
    flush(&mut current, &mut out);
    out
}

/// docker's `config.json`: `auths: {HOST: {auth: base64(user:pass)}}` (or `username`/`password` fields).
/// Credential helpers (`credsStore`, `credHelpers`) are not run: they are the user's programs.
fn parse_docker_config(text: &str) -> Vec<Credential> {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring ~/.docker/config.json: not valid JSON");
            return Vec::new();
        }
    };
    let Some(auths) = value.get("auths").and_then(|a| a.as_object()) else { return Vec::new() };
    let mut out = Vec::new();
    for (host, entry) in auths.iter().take(MAX_CREDENTIALS) {
        let decoded = entry
            .get("auth")
            .and_then(|a| a.as_str())
            .and_then(|a| base64::engine::general_purpose::STANDARD.decode(a.trim()).ok())
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|text| text.split_once(':').map(|(u, p)| (u.to_string(), p.to_string())));
        let fields = || {
            let user = entry.get("username")?.as_str()?;
            let password = entry.get("password")?.as_str()?;
            Some((user.to_string(), password.to_string()))
        };
        if let Some((login, password)) = decoded.or_else(fields) {
            out.push(Credential { host: normalize_host(host), login, password });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netrc_with_oauthtoken_login() {
        let text = "# NGC\nmachine nvcr.io login $oauthtoken password nvapi-SECRET\n\
                    machine 127.0.0.1:5000\n  login alice\n  password pw1\nmachine 127.0.0.1:5000 login bob password pw2\n";
        let c = RegistryCredentials::from_netrc(text);
        assert_eq!(c.for_registry("nvcr.io", None), Some(("$oauthtoken".into(), "nvapi-SECRET".into())));
        assert_eq!(c.for_registry("127.0.0.1:5000", None), Some(("alice".into(), "pw1".into())));
        assert_eq!(c.for_registry("127.0.0.1:5000", Some("bob")), Some(("bob".into(), "pw2".into())));
        assert_eq!(c.for_registry("127.0.0.1:5000", Some("carol")), None);
        assert_eq!(c.for_registry("ghcr.io", None), None);
    }

    #[test]
    fn netrc_incomplete_entries_are_dropped() {
        let c = RegistryCredentials::from_netrc("machine a.io login x\nmachine b.io password y\nmachine");
        assert!(c.hosts().is_empty());
    }

    #[test]
    fn docker_config_auth_base64() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3:cret");
        let text = format!(
            r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{auth}"}},
                "ghcr.io": {{"username": "u", "password": "p"}}, "bad.io": {{"auth": "!!"}}}},
                "credsStore": "desktop"}}"#
        );
        let c = RegistryCredentials::from_docker_config(&text);
        assert_eq!(c.for_registry("docker.io", None), Some(("alice".into(), "s3:cret".into())));
        assert_eq!(c.for_registry("ghcr.io", None), Some(("u".into(), "p".into())));
        assert_eq!(c.for_registry("bad.io", None), None);
    }

    #[test]
    fn load_reads_both_files_and_tolerates_missing_ones() {
        let home = tempfile::tempdir().expect("tempdir");
        assert!(RegistryCredentials::load(home.path()).hosts().is_empty());
        std::fs::create_dir_all(home.path().join(".config/enroot")).expect("mkdir");
        std::fs::write(home.path().join(".config/enroot/.credentials"), "machine nvcr.io login $oauthtoken password k")
            .expect("write");
        std::fs::create_dir_all(home.path().join(".docker")).expect("mkdir");
        std::fs::write(home.path().join(".docker/config.json"), r#"{"auths":{"nvcr.io":{"auth":"eDp5"}}}"#)
            .expect("write");
        let c = RegistryCredentials::load(home.path());
        // enroot's file comes first.
        assert_eq!(c.for_registry("nvcr.io", None), Some(("$oauthtoken".into(), "k".into())));
        assert_eq!(c.for_registry("nvcr.io", Some("x")), Some(("x".into(), "y".into())));
    }

    #[test]
    fn debug_shows_hosts_not_secrets() {
        let c = RegistryCredentials::from_netrc("machine nvcr.io login $oauthtoken password TOPSECRET");
        let text = format!("{c:?}");
        assert!(text.contains("nvcr.io"), "{text}");
        assert!(!text.contains("TOPSECRET") && !text.contains("oauthtoken"), "{text}");
    }
}

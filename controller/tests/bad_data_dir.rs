//! A replica refuses to start on a data directory it cannot trust, and says which one.

use std::process::Command;

/// A valid `[security]` section: a throwaway CA, this replica's certificate and a cluster key.
fn security(dir: &std::path::Path) -> String {
    use drover_auth::tls::{Role, generate_ca, issue, write_pem};
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ca = generate_ca("test CA").unwrap();
    write_pem(&ca, &pki.join("ca.pem"), &pki.join("ca.key"), 0o600).unwrap();
    let cert = issue(&ca, &Role::Controller(1), &[], &["127.0.0.1".parse().unwrap()], 30).unwrap();
    write_pem(&cert, &pki.join("c.pem"), &pki.join("c.key"), 0o600).unwrap();
    drover_auth::ClusterKey::generate().write_new(&pki.join("cluster.key")).unwrap();
    let p = |name: &str| pki.join(name).display().to_string();
    format!(
        "\n[security]\nkey_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
        p("cluster.key"),
        p("ca.pem"),
        p("c.pem"),
        p("c.key")
    )
}

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("controller.toml");
    let text = format!("id = 1\nlisten = \"127.0.0.1:0\"\ndata_dir = {:?}\n", dir.join("data").display().to_string());
    std::fs::write(&path, text + &security(dir)).unwrap();
    path
}

#[test]
fn a_corrupt_data_directory_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data/db");
    std::fs::create_dir_all(&db).unwrap();
    std::fs::write(db.join("CURRENT"), "MANIFEST-999999\n").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_drover-controller")).arg("--config").arg(config(dir.path())).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&dir.path().join("data").display().to_string()), "the error names the path: {err}");
}

#[test]
fn data_of_another_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = drover_controller::store::open_db(&dir.path().join("data")).unwrap();
        let cf = db.cf("raft");
        db.db.put_cf(cf, b"format_version", 99u32.to_be_bytes()).unwrap();
    }
    let err = drover_controller::store::open_db(&dir.path().join("data")).err().expect("refused").to_string();
    assert!(
        err.contains("format version") && err.contains(&format!("reads version {}", drover_state::FORMAT_VERSION)),
        "{err}"
    );
}

#[test]
fn data_of_format_version_1_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = drover_controller::store::open_db(&dir.path().join("data")).unwrap();
        let cf = db.cf("raft");
        db.db.put_cf(cf, b"format_version", 1u32.to_be_bytes()).unwrap();
    }
    let db = drover_controller::store::open_db(&dir.path().join("data")).expect("version 1 opens");
    let stamped = db.db.get_cf(db.cf("raft"), b"format_version").unwrap().unwrap();
    assert_eq!(stamped, drover_state::FORMAT_VERSION.to_be_bytes(), "restamped with the current version");
    assert!(db.db.cf_handle("objects").is_some(), "the registry family version 2 adds exists");
}

#[test]
fn an_invalid_config_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let text = "id = 1\nlisten = \"not-an-address\"\ndata_dir = \"/tmp/x\"\n".to_string() + &security(dir.path());
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drover-controller")).arg("--config").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("c.toml") && err.contains("listen"), "{err}");
}

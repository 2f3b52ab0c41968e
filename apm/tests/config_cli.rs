//! `apm config check` against the example files and broken ones.

use std::process::Command;

fn check(path: &str, json: bool) -> (bool, String, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_apm"));
    cmd.args(["config", "check", path]).current_dir(root);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("apm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_example_configs_are_valid() {
    for file in [
        "examples/config/infiniband.toml",
        "examples/config/roce.toml",
    ] {
        let (ok, out, err) = check(file, false);
        assert!(ok, "{file}: {out}{err}");
        assert!(out.contains("valid"));
    }
    let (ok, out, _) = check("examples/config/roce.toml", true);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["lap_transport"], "udp");
    assert_eq!(v["policy"]["lap_timeout_ms"], 100);
}

#[test]
fn a_broken_config_names_file_line_and_problem_and_fails() {
    let dir = std::env::temp_dir().join(format!("apm-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n\n[lap]\ntransport = \"cm\"\n",
    )
    .expect("write");
    let (ok, _, err) = check(file.to_str().expect("utf-8 path"), false);
    assert!(!ok);
    assert!(err.contains("bad.toml:line 6, column 13"), "{err}");
    assert!(err.contains("use transport = \"udp\""), "{err}");
    let (ok, out, _) = check(file.to_str().expect("utf-8 path"), true);
    assert!(!ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"][0]["line"], 6);
    let (ok, _, err) = check("no/such/file.toml", false);
    assert!(!ok && err.contains("cannot read"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_the_config_names_are_checked_at_their_line() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("apm-config-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sim = dir.join("sim.toml");
    std::fs::write(
        &sim,
        "[[device]]\nname = \"h0\"\nprovider = \"sim\"\n\n[sim]\nscenario = \"no/such/scenario.toml\"\n",
    )
    .expect("write");
    let (ok, _, err) = check(sim.to_str().expect("utf-8"), false);
    assert!(!ok);
    assert!(
        err.contains("sim.toml:line 6, column 12: sim.scenario: cannot read no/such/scenario.toml"),
        "{err}"
    );
    let key = dir.join("peer.key");
    std::fs::write(&key, [7u8; 32]).expect("key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let roce = dir.join("roce.toml");
    std::fs::write(
        &roce,
        format!(
            "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"0.0.0.0:1\"\nkey_file = \"{}\"\n",
            key.display()
        ),
    )
    .expect("write");
    let (ok, _, err) = check(roce.to_str().expect("utf-8"), false);
    assert!(!ok);
    assert!(
        err.contains("line 6, column 12: lap.key_file:") && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (ok, out, err) = check(roce.to_str().expect("utf-8"), false);
    assert!(ok, "{err}");
    assert!(out.contains("unauthenticated peers refused"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

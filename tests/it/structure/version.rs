//! One version everywhere: `scripts/set-version --check` finds every place that follows
//! Cargo.toml's version (the chart, each client package, the READMEs' install lines, the
//! Dockerfile's tag) agreeing with it; a copy with one place changed fails naming that place;
//! `scripts/set-version X.Y.Z` writes every place so that the check passes again; and
//! `oncegate --version` prints the version and the commit built.

use std::path::Path;
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn set_version(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(root().join("scripts/set-version"))
        .args(args)
        .output()
        .expect("python3 runs scripts/set-version")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of the files the version lives in (what `--list` names), in a new directory.
fn copy_of_places() -> tempfile::TempDir {
    let listed = set_version(&["--list"]);
    assert!(listed.status.success(), "--list: {}", stderr(&listed));
    let dir = tempfile::tempdir().unwrap();
    let files = String::from_utf8(listed.stdout).unwrap();
    assert!(files.lines().count() >= 15, "--list names the places: {files}");
    for rel in files.lines() {
        let to = dir.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root().join(rel), &to).unwrap_or_else(|e| panic!("copy {rel}: {e}"));
    }
    dir
}

#[test]
fn the_version_is_cargo_tomls_everywhere() {
    let out = set_version(&["--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_place_that_differs_fails_the_check_by_name_and_set_version_mends_it() {
    let copy = copy_of_places();
    let at = copy.path().to_str().unwrap();
    let chart = copy.path().join("helm/oncegate/Chart.yaml");
    let text = std::fs::read_to_string(&chart).unwrap();
    let changed = text.replacen(
        &format!("appVersion: \"{}\"", env!("CARGO_PKG_VERSION")),
        "appVersion: \"9.9.9\"",
        1,
    );
    assert_ne!(text, changed, "the chart's appVersion is Cargo.toml's");
    std::fs::write(&chart, changed).unwrap();

    let out = set_version(&["--root", at, "--check"]);
    assert!(!out.status.success(), "a changed appVersion passed the check");
    let err = stderr(&out);
    assert!(
        err.contains("helm/oncegate/Chart.yaml:9: says 9.9.9")
            && err.contains(&format!("Cargo.toml says {}", env!("CARGO_PKG_VERSION"))),
        "the failure names the place and both versions: {err}"
    );
    assert_eq!(
        err.matches("version differs").count(),
        1,
        "only the changed place: {err}"
    );

    let out = set_version(&["--root", at, "2.3.4-rc.1"]);
    assert!(out.status.success(), "set-version: {}", stderr(&out));
    let out = set_version(&["--root", at, "--print"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2.3.4-rc.1");
    let out = set_version(&["--root", at, "--check"]);
    assert!(out.status.success(), "after set-version: {}", stderr(&out));

    let out = set_version(&["--root", at, "2.3"]);
    assert_eq!(out.status.code(), Some(64), "not a version: {}", stderr(&out));
}

#[test]
fn version_prints_the_version_and_the_commit_built() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned());
    // A build from a source archive (no git) says "unknown"; ONCEGATE_BUILD_COMMIT overrides.
    let commit = std::env::var("ONCEGATE_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or(head)
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        printed.trim(),
        format!("oncegate {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
}

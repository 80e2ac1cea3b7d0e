//! Compiles `proto/` with protox (pure Rust): no system `protoc` needed. Also records the git
//! commit the binary is built from, for `oncegate --version`.
use std::{env, fs, path::PathBuf, process::Command};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // sqlx::migrate! embeds migrations/ at compile time.
    println!("cargo:rerun-if-changed=migrations");
    let fds = protox::compile(["oncegate/v1/gate.proto", "oncegate/v1/effects.proto"], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out.join("oncegate_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rustc-env=ONCEGATE_BUILD_COMMIT={}", build_commit());
    Ok(())
}

/// The commit being built: `ONCEGATE_BUILD_COMMIT` when set (a build from a source archive,
/// the Dockerfile's build argument), else git's HEAD (12 hex digits) when the crate is the root
/// of its git work tree, else "unknown" (no git, not a clone, or sources inside another
/// repository). A dirty work tree is not marked: the release builds from a clean one.
fn build_commit() -> String {
    println!("cargo:rerun-if-env-changed=ONCEGATE_BUILD_COMMIT");
    if let Ok(commit) = env::var("ONCEGATE_BUILD_COMMIT")
        && !commit.trim().is_empty()
    {
        return commit.trim().to_owned();
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    };
    // Only this crate's own repository: sources unpacked inside another one are not its HEAD.
    let top = git(&["rev-parse", "--show-toplevel"]).map(PathBuf::from);
    let here = env::var("CARGO_MANIFEST_DIR").map(PathBuf::from);
    match (top.map(|t| t.canonicalize()), here.map(|h| h.canonicalize())) {
        (Some(Ok(top)), Ok(Ok(here))) if top == here => {}
        _ => return "unknown".to_owned(),
    }
    // A new commit or a checkout moves HEAD or the branch it names: build again then. (In a
    // worktree these live in the worktree's and the common git directory; --git-path knows.)
    for path in ["HEAD", "logs/HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            watch(&p);
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        watch(&p);
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}

/// Builds again when `path` changes; a missing file is not watched (cargo would build again
/// every time).
fn watch(path: &str) {
    if std::path::Path::new(path).exists() {
        println!("cargo:rerun-if-changed={path}");
    }
}

//! Compiles `proto/` with protox (pure Rust): no system `protoc` needed.
use std::{env, fs, path::PathBuf};

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
    Ok(())
}

//! Generates the gRPC code from `proto/cellium/v1/*.proto`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not when it is compiled: a script built for another checkout
    // sharing the target directory would otherwise read that checkout's files.
    let root =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no CARGO_MANIFEST_DIR")?)
            .join("../../proto");
    let dir = root.join("cellium/v1");
    let mut protos: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    // Sorted so that generated code does not depend on directory order.
    protos.sort();
    println!("cargo:rerun-if-changed={}", dir.display());
    tonic_prost_build::configure().compile_protos(&protos, &[root])?;
    Ok(())
}

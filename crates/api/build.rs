//! Generates the gRPC code from `proto/cellium/v1/*.proto`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
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

//! Builds `bpf/datapath.bpf.c` into a libbpf skeleton and extracts the C
//! layout of every shared struct, so unit tests compare the Rust mirrors
//! with what the C compiler actually produced.

use std::env;
use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bpf = manifest.join("../../bpf");
    let include = bpf.join("include");
    // Debian keeps asm/types.h under the multiarch directory.
    let multiarch = "/usr/include/x86_64-linux-gnu";

    let source = bpf.join("datapath.bpf.c");
    let object = out.join("datapath.bpf.o");
    SkeletonBuilder::new()
        .source(&source)
        .obj(&object)
        .clang_args([
            format!("-I{}", include.display()),
            format!("-I{}", bpf.display()),
            format!("-I{multiarch}"),
            "-Wall".to_string(),
            "-Werror".to_string(),
        ])
        .build_and_generate(out.join("datapath.skel.rs"))
        .expect("compiling bpf/datapath.bpf.c");

    // What names this object among the programs pinned by earlier agents (`src/programs.rs`):
    // equal hashes mean the same programs. A hasher that differs between Rust releases only
    // makes an upgraded agent load afresh once.
    let bytes = std::fs::read(&object).expect("reading the compiled object");
    let mut hasher = DefaultHasher::new();
    hasher.write(&bytes);
    std::fs::write(
        out.join("object_hash.rs"),
        format!("{:#018x}\n", hasher.finish()),
    )
    .expect("writing object_hash.rs");

    // A host program that prints the headers' sizes and offsets as Rust
    // constants: the ground truth for the `abi` layout tests.
    let layout_src = manifest.join("build/layout.c");
    let layout_bin = out.join("layout");
    let status = Command::new("clang")
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{multiarch}"))
        .arg("-o")
        .arg(&layout_bin)
        .arg(&layout_src)
        .status()
        .expect("running clang for build/layout.c");
    assert!(status.success(), "compiling build/layout.c failed");
    let output = Command::new(&layout_bin)
        .output()
        .expect("running the layout program");
    assert!(output.status.success(), "the layout program failed");
    std::fs::write(out.join("layout.rs"), output.stdout).expect("writing layout.rs");

    println!("cargo:rerun-if-changed={}", bpf.display());
    for dir in ["include/cellium", "lib"] {
        println!("cargo:rerun-if-changed={}", bpf.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", layout_src.display());
}

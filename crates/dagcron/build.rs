//! Links the binary with its relative relocations packed (`DT_RELR`),
//! where the linker and the C library know them (GNU ld 2.38, glibc
//! 2.36): a position-independent binary otherwise carries a table of
//! 24 bytes for each of its ~90,000 pointers (2 MiB here), which the
//! loader reads whole at every start, and which stays resident. Packed,
//! it is a few KiB. Whether they are known is probed by linking an empty
//! program with the flag, with the C compiler Rust links through.

use std::path::PathBuf;
use std::process::{Command, Stdio};

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if linux && native && links_with_packed_relocations() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
}

/// Whether an empty C program links with [`FLAG`].
fn links_with_packed_relocations() -> bool {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let source = out.join("relr-probe.c");
    if std::fs::write(&source, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(cc)
        .arg("-pie")
        .arg("-fPIE")
        .arg(FLAG)
        .arg(&source)
        .arg("-o")
        .arg(out.join("relr-probe"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

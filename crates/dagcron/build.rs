//! Links the binary with its relative relocations packed (`DT_RELR`),
//! where the C library runs them (glibc 2.36 and later): a
//! position-independent binary otherwise carries a table of 24 bytes for
//! each of its ~90,000 pointers (2 MiB here), which the loader reads whole
//! at every start, and which stays resident. Packed, it is a few KiB.
//! Such a binary needs glibc 2.36 wherever it runs (the loader refuses it
//! before, saying so); on an older system the flag is not used. Probed by
//! building and running a small program with the flag and a pointer to
//! relocate, with the C compiler, after checking the C library's version.

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

/// Whether this system's C library is glibc 2.36 or later, and a small
/// program with a relative relocation links with [`FLAG`] and runs.
fn links_with_packed_relocations() -> bool {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let glibc = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            let (major, minor) = v.trim().strip_prefix("glibc ")?.split_once('.')?;
            Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?))
        });
    if glibc.is_none_or(|v| v < (2, 36)) {
        return false;
    }
    let source = out.join("relr-probe.c");
    let program = out.join("relr-probe");
    let text =
        "static const char *word = \"relr\";\nint main(void) { return word[0] == 'r' ? 0 : 1; }\n";
    if std::fs::write(&source, text).is_err() {
        return false;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let quiet = |command: &mut Command| {
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    quiet(
        Command::new(cc)
            .args(["-pie", "-fPIE", "-Wl,--fatal-warnings", FLAG])
            .arg(&source)
            .arg("-o")
            .arg(&program),
    ) && quiet(&mut Command::new(&program))
}

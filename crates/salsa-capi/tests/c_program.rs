//! The C API as C sees it: the installed header is the generated one, and a C program compiled
//! against it and linked with `libsalsa.so` runs every call and its error cases.

mod common;
use common::library_dir;
use std::path::PathBuf;
use std::process::Command;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_installed_header_is_the_generated_one() {
    let generated = std::fs::read_to_string(env!("SALSA_GENERATED_HEADER")).expect("build.rs generated the header");
    let installed = std::fs::read_to_string(manifest_dir().join("include/salsa.h")).unwrap_or_default();
    assert!(
        generated == installed,
        "crates/salsa-capi/include/salsa.h is out of date; copy {} over it",
        env!("SALSA_GENERATED_HEADER")
    );
}

#[test]
fn a_c_program_embeds_a_pool() {
    let work = tempfile::tempdir().expect("temp dir");
    let program = work.path().join("embed");
    let lib = library_dir();
    let compiled = Command::new("cc")
        .args([
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
            "-o",
        ])
        .arg(&program)
        .arg(manifest_dir().join("tests/c/embed.c"))
        .arg("-I")
        .arg(manifest_dir().join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lsalsa")
        .output()
        .expect("cc runs");
    assert!(
        compiled.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let device = format!("{}:64M", work.path().join("pool.img").display());
    let run = Command::new(&program)
        .arg(&device)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("the program runs");
    let (out, err) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "the C program failed:\n{out}{err}");
    assert!(out.contains("all checks passed"), "{out}");
}

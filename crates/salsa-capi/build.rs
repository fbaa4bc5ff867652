//! Generates `salsa.h` from the `extern "C"` functions with cbindgen, into `OUT_DIR`; the test
//! suite checks that `include/salsa.h` (the header users install) is the same text, so the
//! header can never drift from the library.

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=src/files.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).expect("cbindgen.toml is valid");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("the C header generates")
        .write_to_file(format!("{out_dir}/salsa.h"));
    println!("cargo:rustc-env=SALSA_GENERATED_HEADER={out_dir}/salsa.h");
}

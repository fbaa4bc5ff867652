//! What the C API's tests share: where cargo put `libsalsa.so`.

use std::path::{Path, PathBuf};

/// The directory cargo put `libsalsa.so` in for this build (next to the test binary's).
pub fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps directory");
    let found = [deps, deps.parent().unwrap_or(deps)]
        .into_iter()
        .find(|d| d.join("libsalsa.so").exists())
        .map(Path::to_path_buf);
    found.expect("cargo builds libsalsa.so (the cdylib) for the tests")
}

//! The library half of the `salsa` command: the benchmark runner (`salsa bench` and its
//! siblings), shared by the command and by the Python bindings (`crates/salsa-py`), which run
//! the same workloads, traces and policy comparisons in-process.

pub mod bench;
pub mod stats_json;
pub use salsa_core::spec;

/// A progress reporter for long operations: a bar on a terminal, silence otherwise.
pub fn progress_bar(what: &'static str) -> impl Fn(u64, u64) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    move |done: u64, total: u64| {
        if tty && total > 0 {
            let width = 40;
            let filled = (done * width / total) as usize;
            eprint!(
                "\r{what} [{}{}] {done}/{total}",
                "#".repeat(filled),
                " ".repeat(width as usize - filled)
            );
            if done >= total {
                eprintln!();
            }
        }
    }
}

//! The house drawn from the code's own imports: every reference from one top-level module of
//! salsa-core to another goes down the layer order `docs/DESIGN.md` draws, and the files inside
//! each folder form no import circle. It reads the sources, so a `use` that reaches up fails
//! here before review has to find it. Doc comments and unit-test modules are left out: a doc
//! link may point anywhere, and a test may use what it tests from any side.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use modules of lower rank only; modules of one rank
/// sit beside each other and may not use each other either.
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["device"],
    &["error", "spec"],
    &["format"],
    &["array", "layout", "policy"],
    &["log"],
    &["controller", "pacing"],
    &["dirty"],
    &["engine"],
    &["recovery"],
    &["pool"],
    &["frontend", "fuzzing"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source file without comments and without its unit-test module.
fn code_of(path: &Path) -> String {
    let src = std::fs::read_to_string(path).expect("read source");
    let src = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => &src[..],
    };
    src.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every name `prefix` is followed by in `code`: `crate::a::x` and `crate::{a, b::c}` give `a`
/// (and `b`).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let head: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !head.is_empty() {
                    names.insert(head);
                }
            }
        } else {
            let head: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !head.is_empty() {
                names.insert(head);
            }
        }
    }
    names
}

struct SourceFile {
    /// Path components under `src/`, the file's stem last (`["engine", "gc", "mod"]`).
    parts: Vec<String>,
    code: String,
}

/// Every source file of the workspace crate `name`.
fn sources(name: &str) -> Vec<SourceFile> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(&src).expect("under src").with_extension("");
            let parts = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            SourceFile {
                parts,
                code: code_of(&path),
            }
        })
        .collect()
}

#[test]
fn no_module_of_salsa_core_reaches_up_or_sideways() {
    let mut arrows = Vec::new();
    let mut checked = 0;
    for file in sources("salsa-core") {
        let top = &file.parts[0];
        if top == "lib" {
            continue;
        }
        let own = rank(top).unwrap_or_else(|| panic!("module `{top}` has no place in LAYERS; give it one (and in docs/DESIGN.md)"));
        // A top-level file's `super::` is the crate root, as is a folder's mod.rs's.
        let mut used = names_after(&file.code, "crate::");
        if file.parts.len() == 1 || (file.parts.len() == 2 && file.parts[1] == "mod") {
            used.extend(names_after(&file.code, "super::"));
        }
        for target in used {
            let Some(target_rank) = rank(&target) else { continue };
            checked += 1;
            if &target != top && target_rank >= own {
                arrows.push(format!("{} uses {target}", file.parts.join("/")));
            }
        }
    }
    assert!(
        checked > 100,
        "the scan found only {checked} references: is it reading the sources?"
    );
    assert!(arrows.is_empty(), "imports that reach up or sideways:\n{}", arrows.join("\n"));
}

/// Finds a circle in `graph` by depth-first search, as the list of nodes along it.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|n| n == node).unwrap_or(0);
                let mut circle = path[start..].to_vec();
                circle.push(node.to_string());
                return Some(circle);
            }
            _ => {}
        }
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, state, path) {
                return Some(circle);
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, graph, &mut state, &mut Vec::new()) {
            return Some(circle);
        }
    }
    None
}

/// The import circles among the files of each folder of crate `name`.
fn folder_circles(name: &str) -> (usize, Vec<String>) {
    // Per folder (the crate's root included): each child module (a file, or a sub-folder) and
    // the siblings it names. The folder's own mod.rs (the crate's lib.rs or main.rs) is its
    // root, which declares and re-exports the children; it is left out, as a parent is not a
    // sibling.
    let mut folders: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let files = sources(name);
    for file in &files {
        for depth in 0..file.parts.len() {
            let folder = file.parts[..depth].to_vec();
            let child = &file.parts[depth];
            if ["mod", "lib", "main"].contains(&child.as_str()) {
                continue;
            }
            let siblings: BTreeSet<String> = files
                .iter()
                .filter(|f| f.parts.len() > depth && f.parts[..depth] == folder[..])
                .map(|f| f.parts[depth].clone())
                .collect();
            let prefix: String = folder.iter().map(|part| format!("{part}::")).collect();
            let mut used = names_after(&file.code, &format!("crate::{prefix}"));
            // `super::` from a direct child file names a sibling (or the folder's own items).
            if depth == file.parts.len() - 1 {
                used.extend(names_after(&file.code, "super::"));
            }
            let edges = folders.entry(folder).or_default().entry(child.clone()).or_default();
            edges.extend(used.into_iter().filter(|n| n != child && siblings.contains(n)));
        }
    }
    let circles: Vec<String> = folders
        .iter()
        .filter_map(|(folder, graph)| find_circle(graph).map(|c| format!("{}/: {}", folder.join("/"), c.join(" -> "))))
        .collect();
    (folders.len(), circles)
}

#[test]
fn the_files_inside_each_folder_form_no_import_circle() {
    for (name, folders_min) in [
        ("salsa-core", 9),
        ("salsa-cli", 3),
        ("salsa-nbd", 1),
        ("salsa-py", 1),
        ("salsa-files", 1),
    ] {
        let (folders, circles) = folder_circles(name);
        assert!(folders >= folders_min, "{name}: only {folders} folders found");
        assert!(circles.is_empty(), "{name}: import circles inside folders:\n{}", circles.join("\n"));
    }
}

//! The layout's two rules, checked over the source text (no compiler
//! plugin): no import cycle among the top-level modules of `src/`, and no
//! function longer than [`MAX_FN_LINES`] except flat tables.
//!
//! A module is a top-level file with its folder (`relay.rs` and `relay/*`
//! are one module, `relay`); an edge `a → b` is any `crate::b` path in `a`'s
//! files. `lib.rs` (which declares every module) and `main.rs` (the binary)
//! are not modules of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function body allowed, in lines, signature to closing brace.
const MAX_FN_LINES: usize = 60;

/// Functions allowed past the limit: flat tables, not logic.
const FLAT_TABLES: &[&str] = &["src/metrics.rs:describe"];

fn src_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            src_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    src_files(&root.join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// `src/relay/nats.rs` → `relay`; `None` for `lib.rs` and `main.rs`.
fn module_of(rel: &str) -> Option<String> {
    let inner = rel.strip_prefix("src/")?;
    let first = inner.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// Code without `//` comments (doc links name modules without using them).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(|l| match l.find("//") {
        Some(i) if !l[..i].contains('"') => &l[..i],
        _ => l,
    })
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in sources() {
        let Some(from) = module_of(&rel) else { continue };
        let deps = graph.entry(from.clone()).or_default();
        for line in code_lines(&text) {
            let mut rest = line;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty()
                    && name != from
                    && name != "pb"
                    && name.chars().next().unwrap().is_lowercase()
                {
                    deps.insert(name);
                }
            }
            // `use crate::{a, b::C}` groups.
            if let Some(group) = line.trim().strip_prefix("use crate::{") {
                for part in group.split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != from && name != "pb" {
                        deps.insert(name);
                    }
                }
            }
        }
    }
    graph
}

/// A cycle through `start`, if there is one (depth-first search).
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(node).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    visit(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn src_modules_import_each_other_without_cycles() {
    let graph = module_graph();
    assert!(graph.len() > 10, "the scan found the modules: {graph:?}");
    assert!(
        graph["app"].contains("gate"),
        "the scan sees imports (app uses gate): {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|c| format!("{} → {}", c.join(" → "), c[0]))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles among src/ modules:\n{}",
        cycles.join("\n")
    );
}

/// `(file:name, lines)` of every function, by brace matching from its `fn`.
fn function_lengths() -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (rel, text) in sources() {
        let lines: Vec<&str> = code_lines(&text).collect();
        for (start, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(sig) = [
                "pub(crate) async fn ",
                "pub async fn ",
                "async fn ",
                "pub(crate) fn ",
                "pub fn ",
                "fn ",
            ]
            .iter()
            .find_map(|p| t.strip_prefix(p)) else {
                continue;
            };
            let name: String = sig
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let mut depth = 0i32;
            let mut opened = false;
            for (end, l) in lines.iter().enumerate().skip(start) {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        // A declaration without a body (trait method).
                        ';' if !opened && depth == 0 => break,
                        _ => {}
                    }
                }
                if !opened && l.trim_end().ends_with(';') {
                    break;
                }
                if opened && depth <= 0 {
                    found.push((format!("{rel}:{name}"), end - start + 1));
                    break;
                }
            }
        }
    }
    found
}

#[test]
fn no_function_in_src_is_longer_than_the_limit() {
    let lengths = function_lengths();
    assert!(
        lengths.len() > 100,
        "the scan found the functions: {}",
        lengths.len()
    );
    let long: Vec<String> = lengths
        .iter()
        .filter(|(name, n)| *n > MAX_FN_LINES && !FLAT_TABLES.contains(&name.as_str()))
        .map(|(name, n)| format!("{name}: {n} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

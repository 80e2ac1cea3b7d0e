//! The layout's rules, checked over the source text (no compiler plugin):
//! no import cycle among the top-level modules of `src/`, nor among sibling
//! modules at any depth (`store/postgres` and `store/sqlite`, a file and its
//! folder as one), nor among the files inside a module (a room such as
//! `broker/kafka` included); no function, whatever its visibility, longer
//! than [`MAX_FN_LINES`] except flat tables; and no trait with more than
//! [`MAX_TRAIT_METHODS`] methods.
//!
//! A module is a top-level file with its folder (`relay.rs` and `relay/*`
//! are one module, `relay`); an edge `a → b` is any `crate::b` path in `a`'s
//! files. `lib.rs` (which declares every module) and `main.rs` (the binary)
//! are not modules of the graph.
//!
//! Inside modules the nodes are files (`broker/kafka/marks` for
//! `src/broker/kafka/marks.rs`): a file's edges are the files its paths name —
//! `crate::a::b`, `super::x`, `self::x`, and a child module it declares
//! (`mod x;`) named bare (`x::Y`). Declaring a child is not an edge; using
//! it is. A file's `#[cfg(test)] mod tests` is not part of its graph.
//!
//! [`design_refs`]: every `DESIGN §N` in the repository names a section of
//! `docs/DESIGN.md`. [`docs`]: every relative link in the README and `docs/`
//! resolves, every shipped alert has its runbook, every test the guarantees
//! name exists, and the README's map names every module. [`version`]: the
//! version in every place that follows Cargo.toml's (`scripts/set-version`),
//! and `oncegate --version`.

mod design_refs;
mod docs;
mod version;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function body allowed, in lines, signature to closing brace.
const MAX_FN_LINES: usize = 60;

/// Functions allowed past the limit: flat tables, not logic.
const FLAT_TABLES: &[&str] = &["src/metrics.rs:describe"];

/// Most methods a trait may declare: a seam small enough to fake in a few
/// lines (the store is split by capability for this).
const MAX_TRAIT_METHODS: usize = 20;

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

/// Modules whose parent files are the seam their children implement (the
/// `Store` trait with its row types, opened by URL scheme; the command
/// tree): there a file may name its ancestors. Every other module —
/// `broker` and its rooms, `relay`, `reconcile` — has a leaf for what its
/// files share, and no file names a file that names it back.
const PARENT_AS_SEAM: &[&str] = &["store", "cli"];

/// Whether `to` is an ancestor of `from` (`store` of `store/postgres/ops`).
fn is_ancestor(to: &str, from: &str) -> bool {
    from.len() > to.len() && from.starts_with(to) && from[to.len()..].starts_with('/')
}

/// The file nodes: `src/broker/kafka/marks.rs` → `broker/kafka/marks`.
fn file_node(rel: &str) -> Option<String> {
    let inner = rel.strip_prefix("src/")?.strip_suffix(".rs")?;
    (!matches!(inner, "lib" | "main")).then(|| inner.to_string())
}

/// The path segments after a prefix (`crate::`, `super::`…): `a::b::C` → [a, b, C].
fn segments(rest: &str) -> Vec<String> {
    let path: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The deepest existing file node under `base` along `path`.
fn deepest(nodes: &BTreeSet<String>, base: &str, path: &[String]) -> Option<String> {
    let mut found = None;
    let mut at = base.to_string();
    for seg in path {
        at = if at.is_empty() {
            seg.clone()
        } else {
            format!("{at}/{seg}")
        };
        if nodes.contains(&at) {
            found = Some(at.clone());
        } else {
            break;
        }
    }
    found
}

/// The names of the child modules a file declares with `mod x;`.
fn declared_children(text: &str) -> Vec<String> {
    code_lines(text)
        .filter_map(|l| {
            let t = l.trim();
            let t = t.strip_prefix("pub ").unwrap_or(t);
            let name = t.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// The names a `use prefix::{a, b::C}` group starts with.
fn group_heads(line: &str, prefix: &str) -> Vec<String> {
    let Some(group) = line.trim().strip_prefix(&format!("use {prefix}::{{")) else {
        return Vec::new();
    };
    group
        .split(',')
        .map(|p| {
            p.trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .filter(|n: &String| !n.is_empty())
        .collect()
}

/// The edges of one file (its text without its test module).
fn file_edges(node: &str, text: &str, nodes: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = node.rsplit_once('/').map_or("", |(p, _)| p).to_string();
    let children = declared_children(text);
    let mut edges = BTreeSet::new();
    let mut add = |target: Option<String>| {
        if let Some(t) = target.filter(|t| t != node) {
            edges.insert(t);
        }
    };
    for line in code_lines(text) {
        for (prefix, base) in [("crate::", ""), ("super::", parent.as_str()), ("self::", node)] {
            let mut rest = line;
            while let Some(i) = rest.find(prefix) {
                let before = rest[..i].chars().last();
                rest = &rest[i + prefix.len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let path = segments(rest);
                add(deepest(nodes, base, &path).or_else(|| (!base.is_empty()).then(|| base.to_string())));
            }
            for head in group_heads(line, prefix.trim_end_matches("::")) {
                add(deepest(nodes, base, &[head]).or_else(|| (!base.is_empty()).then(|| base.to_string())));
            }
        }
        for child in &children {
            let mut rest = line;
            let bare = format!("{child}::");
            while let Some(i) = rest.find(&bare) {
                let before = rest[..i].chars().last();
                rest = &rest[i + bare.len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut path = vec![child.clone()];
                path.extend(segments(rest));
                add(deepest(nodes, node, &path));
            }
        }
    }
    edges
}

/// Every file's edges (see the module doc).
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(String, String)> = sources()
        .into_iter()
        .filter_map(|(rel, text)| {
            let node = file_node(&rel)?;
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            Some((node, text))
        })
        .collect();
    let nodes: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
    files
        .iter()
        .map(|(node, text)| {
            let top = node.split('/').next().unwrap_or_default();
            let mut edges = file_edges(node, text, &nodes);
            if PARENT_AS_SEAM.contains(&top) {
                edges.retain(|to| !is_ancestor(to, node));
            }
            (node.clone(), edges)
        })
        .collect()
}

#[test]
fn files_inside_modules_import_each_other_without_cycles() {
    let graph = file_graph();
    assert!(
        graph["broker"].contains("broker/kafka") && graph["broker/kafka"].contains("broker/kafka/marks"),
        "the scan sees a registry's rooms and a room's files: {:?} {:?}",
        graph["broker"],
        graph["broker/kafka"]
    );
    assert!(
        graph["broker/kafka/marks"].contains("broker/seam"),
        "the scan resolves crate paths to files: {:?}",
        graph["broker/kafka/marks"]
    );
    let cycles: BTreeSet<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|mut c| {
            // One rotation per cycle, so each is reported once.
            let start = c.iter().enumerate().min_by_key(|(_, n)| *n).map_or(0, |(i, _)| i);
            c.rotate_left(start);
            format!("{} → {}", c.join(" → "), c[0])
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles among the files of src/:\n{}",
        cycles.into_iter().collect::<Vec<_>>().join("\n")
    );
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

/// `line` without its indentation and visibility (`pub`, `pub(crate)`,
/// `pub(super)`, `pub(in …)`); `None` where `pub` is the start of a name.
fn after_visibility(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let Some(rest) = t.strip_prefix("pub") else {
        return Some(t);
    };
    match rest.strip_prefix('(') {
        Some(scope) => Some(scope.split_once(')')?.1.trim_start()),
        None if rest.starts_with(' ') => Some(rest.trim_start()),
        None => None,
    }
}

/// What follows `fn ` when `line` starts a function, whatever its
/// visibility (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`) and
/// qualifiers (`const`, `async`, `unsafe`, `extern "C"`).
fn fn_signature(line: &str) -> Option<&str> {
    let mut t = after_visibility(line)?;
    loop {
        let before = t;
        for qualifier in ["const ", "async ", "unsafe ", "default "] {
            if let Some(rest) = t.strip_prefix(qualifier) {
                t = rest.trim_start();
            }
        }
        if let Some(rest) = t.strip_prefix("extern ") {
            let rest = rest.trim_start();
            t = match rest.strip_prefix('"') {
                Some(abi) => abi.split_once('"')?.1.trim_start(),
                None => rest,
            };
        }
        if t == before {
            break;
        }
    }
    t.strip_prefix("fn ")
}

/// `(file:name, lines)` of every function, by brace matching from its `fn`.
fn function_lengths() -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (rel, text) in sources() {
        let lines: Vec<&str> = code_lines(&text).collect();
        for (start, line) in lines.iter().enumerate() {
            let Some(sig) = fn_signature(line) else {
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

/// The sibling modules of every folder, each a file with its folder
/// (`store/postgres` is `postgres.rs` and `postgres/*`), and their edges:
/// a file of one naming a file of another. `""` is `src/` itself (the
/// top-level modules, as [`module_graph`] reads them by path).
fn sibling_graphs() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let files = file_graph();
    let mut groups: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, targets) in &files {
        for to in targets {
            let (a, b): (Vec<&str>, Vec<&str>) = (from.split('/').collect(), to.split('/').collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            // An ancestor or a descendant is not a sibling.
            if common == a.len() || common == b.len() {
                continue;
            }
            let parent = a[..common].join("/");
            let sibling = |path: &[&str]| path[..=common].join("/");
            groups
                .entry(parent)
                .or_default()
                .entry(sibling(&a))
                .or_default()
                .insert(sibling(&b));
        }
    }
    groups
}

#[test]
fn sibling_modules_at_every_depth_import_each_other_without_cycles() {
    let groups = sibling_graphs();
    assert!(
        groups
            .get("broker")
            .is_some_and(|g| g.contains_key("broker/kafka")),
        "the scan sees the rooms of a registry as siblings: {:?}",
        groups.get("broker")
    );
    assert!(
        groups
            .get("store")
            .is_some_and(|g| g.contains_key("store/postgres")),
        "the scan sees a backend and its folder as one sibling: {:?}",
        groups.get("store")
    );
    let cycles: BTreeSet<String> = groups
        .iter()
        .flat_map(|(parent, graph)| {
            graph.keys().filter_map(move |m| {
                let mut c = cycle_from(graph, m)?;
                let start = c.iter().enumerate().min_by_key(|(_, n)| *n).map_or(0, |(i, _)| i);
                c.rotate_left(start);
                Some(format!(
                    "in {}/: {} → {}",
                    if parent.is_empty() { "src" } else { parent },
                    c.join(" → "),
                    c[0]
                ))
            })
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles among sibling modules:\n{}",
        cycles.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// `(file:trait, methods)` of every trait: the `fn` items at its body's top
/// level, by brace matching from `trait`.
fn trait_sizes() -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (rel, text) in sources() {
        let lines: Vec<&str> = code_lines(&text).collect();
        for (start, line) in lines.iter().enumerate() {
            let Some(t) = after_visibility(line) else {
                continue;
            };
            let Some(rest) = t
                .strip_prefix("trait ")
                .or_else(|| t.strip_prefix("unsafe trait "))
            else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let (mut depth, mut opened, mut methods) = (0i32, false, 0usize);
            for l in &lines[start..] {
                if opened && depth == 1 && fn_signature(l).is_some() {
                    methods += 1;
                }
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if opened && depth <= 0 {
                    break;
                }
            }
            found.push((format!("{rel}:{name}"), methods));
        }
    }
    found
}

#[test]
fn no_trait_in_src_has_more_than_the_limit_of_methods() {
    let sizes = trait_sizes();
    let held = sizes.iter().find(|(name, _)| name == "src/store.rs:HeldLock");
    assert!(
        held.is_some_and(|(_, n)| *n == 1) && sizes.len() > 3,
        "the scan finds the traits and counts a trait's methods: {held:?} of {}",
        sizes.len()
    );
    let large: Vec<String> = sizes
        .iter()
        .filter(|(_, n)| *n > MAX_TRAIT_METHODS)
        .map(|(name, n)| format!("{name}: {n} methods"))
        .collect();
    assert!(
        large.is_empty(),
        "traits over {MAX_TRAIT_METHODS} methods:\n{}",
        large.join("\n")
    );
}

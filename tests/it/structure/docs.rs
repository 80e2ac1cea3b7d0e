//! The documentation holds together.
//!
//! - Every relative link in `README.md` and `docs/` (the `.md` files, at any
//!   depth) resolves: the file or folder exists, and a `#anchor` is a
//!   heading of the target (slugged as GitHub does) or an `<a id>` in it.
//!   Links inside code fences and code spans are not links.
//! - Every alert the chart ships (`- alert: Name` in its PrometheusRule) has
//!   its runbook: a heading `Name` in `docs/OPERATING.md`, the anchor its
//!   `runbook_url` annotation points at (the chart's test checks the
//!   annotation itself).
//! - Every test the README and `docs/GUARANTEES.md` name (`module::…::name`,
//!   `*` for each store or every test of a module) is one this binary lists,
//!   or a unit test (`…::tests::…`) defined in `src/`.
//! - The README's map names every module `src/lib.rs` declares.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

const README: &str = "README.md";
const DOCS: &str = "docs";
const RUNBOOKS: &str = "docs/OPERATING.md";
const GUARANTEES: &str = "docs/GUARANTEES.md";
const ALERT_RULES: &str = "helm/oncegate/templates/prometheusrule.yaml";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel} is readable: {e}"))
}

/// The Markdown files checked, as paths from the root: the README, then
/// every `.md` under `docs/`.
fn documents() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("docs/ is readable") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join(DOCS), &mut found);
    found.sort();
    let docs = found.iter().map(|p| {
        p.strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/")
    });
    std::iter::once(README.to_string()).chain(docs).collect()
}

/// The lines of `text` outside code fences, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` with every code span blanked out (a run of backticks opens one,
/// the next run of the same length closes it), so what looks like a link
/// inside code is not one. Byte offsets are kept.
fn without_code_spans(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'`' {
            i += 1;
            continue;
        }
        let run = b[i..].iter().take_while(|&&c| c == b'`').count();
        let fence = &line[i..i + run];
        let Some(close) = line[i + run..].find(fence) else {
            break;
        };
        let end = i + run + close + run;
        out[i..end].fill(b' ');
        i = end;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The inline link targets of a Markdown text, `(line, target)`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find([')', ' ']).unwrap_or(rest.len());
            found.push((n, rest[..end].trim_matches(['<', '>']).to_string()));
            rest = &rest[end..];
        }
    }
    found
}

/// GitHub's anchor for a heading: the text as rendered (code, emphasis and
/// link markup gone), lower case, every character but letters, digits,
/// `_`, `-` and spaces dropped, spaces turned into hyphens.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link's text stays, its target goes.
    while let Some(open) = rest.find("](") {
        let close = rest[open..].find(')').map_or(rest.len(), |c| open + c + 1);
        text.push_str(&rest[..open]);
        rest = &rest[close..];
    }
    text.push_str(rest);
    text.chars()
        .filter(|c| !matches!(c, '`' | '*' | '['))
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown text defines: each heading's slug (a repeated one
/// gets `-1`, `-2`, … as on GitHub) and every `<a id="…">`/`<a name="…">`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = slug(heading.trim().trim_end_matches('#').trim_end());
                let mut anchor = base.clone();
                let mut n = 0;
                while !found.insert(anchor.clone()) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
            }
        }
        for attr in ["<a id=\"", "<a name=\""] {
            for (i, _) in line.match_indices(attr) {
                let value = &line[i + attr.len()..];
                found.insert(value[..value.find('"').unwrap_or(0)].to_string());
            }
        }
    }
    found
}

/// `base/rel` with `.` and `..` resolved, as a path from the root.
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.join(rel).components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// What is wrong with `target`, linked from `doc`, if anything.
fn broken(doc: &str, target: &str) -> Option<String> {
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let rel = if path.is_empty() {
        PathBuf::from(doc)
    } else {
        let base = Path::new(doc).parent().unwrap_or(Path::new(""));
        match resolve(base, path) {
            Some(rel) => rel,
            None => return Some("leaves the repository".into()),
        }
    };
    let shown = rel.to_string_lossy().replace('\\', "/");
    if !root().join(&rel).exists() {
        return Some(format!("{shown} does not exist"));
    }
    if anchor.is_empty() {
        return None;
    }
    if rel.extension().is_none_or(|e| e != "md") {
        return Some(format!("an anchor into {shown}, which is not Markdown"));
    }
    let known = anchors(&read(&shown));
    (!known.contains(anchor)).then(|| format!("{shown} has no heading with the anchor #{anchor}"))
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let (mut checked, mut with_anchor, mut problems) = (0, 0, Vec::new());
    for doc in documents() {
        for (line, target) in links(&read(&doc)) {
            let external = target.contains("://") || target.starts_with("mailto:");
            if external || target.is_empty() {
                continue;
            }
            checked += 1;
            with_anchor += usize::from(target.contains('#'));
            if let Some(why) = broken(&doc, &target) {
                problems.push(format!("{doc}:{line}: links to {target}: {why}"));
            }
        }
    }
    assert!(
        checked > 150 && with_anchor > 50,
        "the scan finds the links: {checked}, {with_anchor} with an anchor"
    );
    assert!(
        problems.is_empty(),
        "links that do not resolve:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_shipped_alert_has_a_runbook() {
    let alerts: Vec<String> = read(ALERT_RULES)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect();
    assert!(
        alerts.len() >= 10,
        "the scan finds the chart's alerts: {alerts:?}"
    );
    let runbooks = anchors(&read(RUNBOOKS));
    let missing: Vec<String> = alerts
        .iter()
        .filter(|name| !runbooks.contains(&name.to_lowercase()))
        .map(|name| format!("{name}: no heading `### {name}` in {RUNBOOKS}"))
        .collect();
    assert!(
        missing.is_empty(),
        "alerts without a runbook:\n{}",
        missing.join("\n")
    );
}

/// The test paths a text names in code spans: `a::b::c`, `a::*`,
/// `a::*::c` (lower-case segments or `*`); a crate path (`oncegate::…`) is
/// not a test.
fn test_paths(text: &str) -> Vec<(usize, String)> {
    let is_segment = |s: &str| {
        s == "*"
            || (!s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
    };
    let mut found = Vec::new();
    for (n, line) in prose_lines(text) {
        for (i, span) in line.split('`').enumerate() {
            let segments: Vec<&str> = span.split("::").collect();
            let path = i % 2 == 1 && segments.len() > 1 && segments.iter().all(|s| is_segment(s));
            if path && segments[0] != "oncegate" && segments[0] != "*" {
                found.push((n, span.to_string()));
            }
        }
    }
    found
}

/// The names of this binary's tests (`module::…::name`), from its own
/// `--list`.
fn listed_tests() -> Vec<String> {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let out = std::process::Command::new(exe)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("the test binary lists its tests");
    String::from_utf8(out.stdout)
        .expect("test names are UTF-8")
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// Whether test `name` is named by `pattern`, where a `*` segment stands for
/// any one segment (`postgres`, `sqlite`), and a final `*` for the rest.
fn names(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<&str>, Vec<&str>) = (pattern.split("::").collect(), name.split("::").collect());
    let rest = p.last() == Some(&"*");
    let fixed = if rest { &p[..p.len() - 1] } else { &p[..] };
    let lengths_fit = if rest {
        n.len() > fixed.len()
    } else {
        n.len() == fixed.len()
    };
    lengths_fit && fixed.iter().zip(&n).all(|(a, b)| *a == "*" || a == b)
}

/// Whether `src/<module>` (file or folder) defines a function `name`: a unit
/// test, which this binary does not list.
fn unit_test_exists(module: &str, name: &str) -> bool {
    let mut files = vec![root().join(format!("src/{module}.rs"))];
    let mut dirs = vec![root().join(format!("src/{module}"))];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for p in entries.map(|e| e.unwrap().path()) {
            if p.is_dir() { dirs.push(p) } else { files.push(p) }
        }
    }
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .any(|s| {
            s.match_indices(&format!("fn {name}"))
                .any(|(i, m)| !s[i + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        })
}

#[test]
fn every_test_the_guarantees_name_exists() {
    let tests = listed_tests();
    assert!(tests.len() > 200, "the binary lists its tests: {}", tests.len());
    let (mut checked, mut missing) = (0, Vec::new());
    for doc in [README, GUARANTEES] {
        for (line, path) in test_paths(&read(doc)) {
            checked += 1;
            let segments: Vec<&str> = path.split("::").collect();
            let unit = segments.contains(&"tests")
                && (segments.last() == Some(&"*")
                    || unit_test_exists(segments[0], segments[segments.len() - 1]));
            if !unit && !tests.iter().any(|t| names(&path, t)) {
                missing.push(format!(
                    "{doc}:{line}: names {path}, which is no test of the suite"
                ));
            }
        }
    }
    assert!(checked > 80, "the scan finds the tests named: {checked}");
    assert!(
        missing.is_empty(),
        "tests named that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_map_names_every_module() {
    let targets: BTreeSet<String> = links(&read(README)).into_iter().map(|(_, t)| t).collect();
    let modules: Vec<String> = read("src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    assert!(modules.len() > 20, "the scan reads lib.rs's modules: {modules:?}");
    let missing: Vec<&String> = modules
        .iter()
        .filter(|m| !targets.contains(&format!("src/{m}.rs")))
        .collect();
    assert!(
        missing.is_empty(),
        "modules of src/lib.rs the README's map does not link (as src/NAME.rs): {missing:?}"
    );
}

#[test]
fn links_and_anchors_are_read_as_github_does() {
    assert_eq!(slug("7.2 Postgres failover"), "72-postgres-failover");
    assert_eq!(
        slug("4.3 Kafka: exactly once to `read_committed` readers"),
        "43-kafka-exactly-once-to-read_committed-readers"
    );
    assert_eq!(
        slug("Trying the chart's pod with podman"),
        "trying-the-charts-pod-with-podman"
    );
    assert_eq!(
        slug("Outbox and audit (DESIGN §3, §4)"),
        "outbox-and-audit-design-3-4"
    );
    assert_eq!(slug("A — B [link](x.md#y) **bold**"), "a--b-link-bold");
    assert_eq!(
        anchors("# T\n## Tests\n```\n## Not\n```\n## Tests\n<a id=\"here\"></a>"),
        ["here", "t", "tests", "tests-1"].map(String::from).into()
    );
    let text = "see [a](x.md#b) and `[c](nope.md)`\n```\n[d](nope.md)\n```\n[e](<y.md>) [f](z.md \"t\")";
    assert_eq!(
        links(text),
        [(1, "x.md#b"), (5, "y.md"), (5, "z.md")].map(|(n, t)| (n, t.to_string()))
    );
    assert_eq!(
        test_paths("`a::b`, `store_suite::*::x`, `ops::*`, `oncegate::pb`, `Foo::bar`, `x`"),
        [(1, "a::b"), (1, "store_suite::*::x"), (1, "ops::*")].map(|(n, t)| (n, t.to_string()))
    );
    assert!(names("store_suite::*::x", "store_suite::sqlite::x"));
    assert!(!names("store_suite::*::x", "store_suite::x"));
    assert!(names("ops::*", "ops::postgres::y") && names("ops::*", "ops::y"));
    assert!(!names("chaos::chaos_short", "chaos::chaos_short_long"));
}

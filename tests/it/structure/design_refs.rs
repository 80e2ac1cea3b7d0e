//! Every citation of the design document names one of its sections.
//!
//! Code, tests, scripts and docs cite `docs/DESIGN.md` as `DESIGN §7` or
//! `DESIGN §7.2` (also `DESIGN.md §1`), a list as `DESIGN §3, §4`. A section
//! is a numbered heading there (`## 7. Reliability`, `### 7.2 Postgres
//! failover`). The whole repository is read (build output, dependencies and
//! hidden folders aside), so a citation in a client, a chart or a migration
//! counts as much as one in `src/`. Inside `docs/DESIGN.md` every `§N` is a
//! citation, except the regulation's sections (`2 CFR §200.334`: three
//! digits or more).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The design document, from the repository's root.
const DESIGN: &str = "docs/DESIGN.md";

/// Folders never read, at any depth: build output and dependencies.
const SKIPPED: &[&str] = &["target", "node_modules", "__pycache__"];

/// The section numbers of the document's headings (`7`, `7.2`), in order;
/// headings inside code fences are not headings.
fn sections(text: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !in_fence) else {
            continue;
        };
        let (number, _) = section_number(heading.trim_start_matches('#').trim_start());
        if !number.is_empty() {
            found.push(number);
        }
    }
    found
}

/// The number `s` starts with and what follows it: `7.2` of `7.2 …`, `7` of
/// `7.` (a full stop ends a sentence or a heading's number) and of `7's`.
fn section_number(s: &str) -> (String, &str) {
    let b = s.as_bytes();
    let digits = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut end = digits(0);
    if end == 0 {
        return (String::new(), s);
    }
    while end + 1 < b.len() && b[end] == b'.' && b[end + 1].is_ascii_digit() {
        end = digits(end + 1);
    }
    (s[..end].to_string(), &s[end..])
}

/// The sections `line` cites: after each `DESIGN §` (or `DESIGN.md §`), the
/// number and any more joined by `, §` or ` and §`.
fn citations(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("DESIGN") {
        let word_start = !rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[i + "DESIGN".len()..];
        let after = rest.strip_prefix(".md").unwrap_or(rest).trim_start_matches(' ');
        let Some(mut tail) = after.strip_prefix('§').filter(|_| word_start) else {
            continue;
        };
        loop {
            let (number, next) = section_number(tail);
            if number.is_empty() {
                break;
            }
            found.push(number);
            match next.strip_prefix(", §").or_else(|| next.strip_prefix(" and §")) {
                Some(more) => tail = more,
                None => break,
            }
        }
    }
    found
}

/// The sections a line of the design document cites: every `§N`, except a
/// number of three digits or more (the regulation's, `§200.334`).
fn internal_citations(line: &str) -> Vec<String> {
    line.split('§')
        .skip(1)
        .map(|after| section_number(after).0)
        .filter(|n| !n.is_empty() && n.split('.').next().is_some_and(|major| major.len() < 3))
        .collect()
}

/// Every file under `dir` but those in [`SKIPPED`] and hidden folders
/// (`.git`, caches) — `.ci` is read. Symbolic links are not followed.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the repository is readable") {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if kind.is_dir() {
            let hidden = name.starts_with('.') && name != ".ci";
            if !hidden && !SKIPPED.contains(&name.as_str()) {
                files(&entry.path(), out);
            }
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
}

/// `(path from the root, text)` of every text file of the repository.
fn repository_texts(root: &Path) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    files(root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let text = String::from_utf8(std::fs::read(&p).ok()?).ok()?;
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            Some((rel, text))
        })
        .collect()
}

#[test]
fn every_design_citation_names_a_section_of_docs_design() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join(DESIGN)).expect("docs/DESIGN.md is readable");
    let numbered = sections(&design);
    let known: BTreeSet<String> = numbered.iter().cloned().collect();
    assert!(
        known.contains("1") && known.contains("7.2") && known.contains("14"),
        "the scan reads the numbered headings: {numbered:?}"
    );
    assert_eq!(
        known.len(),
        numbered.len(),
        "a section number used twice: {numbered:?}"
    );

    let (mut cited, mut missing) = (0, Vec::new());
    for (rel, text) in repository_texts(root) {
        for (i, line) in text.lines().enumerate() {
            let refs = if rel == DESIGN {
                internal_citations(line)
            } else {
                citations(line)
            };
            for number in refs {
                cited += 1;
                if !known.contains(&number) {
                    missing.push(format!(
                        "{rel}:{}: cites §{number}, which {DESIGN} does not have",
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(cited > 50, "the scan finds the citations: {cited}");
    assert!(
        missing.is_empty(),
        "citations of sections {DESIGN} does not have (its sections: {}):\n{}",
        numbered.join(" "),
        missing.join("\n")
    );
}

#[test]
fn a_citation_is_read_as_written() {
    // Built at run time, so this file's examples are not citations itself.
    let d = "DESIGN";
    assert_eq!(citations(&format!("as {d} §7.")), ["7"]);
    assert_eq!(
        citations(&format!("({d} §4.2, §9 and §10; README)")),
        ["4.2", "9", "10"]
    );
    assert_eq!(citations(&format!("{d}.md §1, byte for byte, §2")), ["1"]);
    assert_eq!(citations(&format!("{d} §9's `effect.completed`")), ["9"]);
    assert!(citations(&format!("RE{d} §3, {d} §N, {d} 7")).is_empty());
    assert_eq!(
        internal_citations("2 CFR §200.303, §200.334; see §7.2 and §10."),
        ["7.2", "10"]
    );
    assert_eq!(
        sections("# t\n## 1. One\n```\n# 9. not a heading\n```\n### 1.2 Sub\n#### Unnumbered"),
        ["1", "1.2"]
    );
}

//! Seal anchors kept outside the database: every seal's number, id range,
//! time, digest, signature and key id, appended as one JSON line to
//! `ONCEGATE_AUDIT_ANCHOR_FILE` (meant for a write-once volume) and synced
//! before the seal is reported done. `oncegate audit verify --anchors`
//! compares the chain with them: an owner who rewrites rows and re-seals
//! the chain changes digests the anchors still hold, and one who cuts off
//! the newest seals with their rows leaves anchored seals the chain lacks.
//!
//! A line: `{"type":"oncegate-audit-anchor","seq":…,"first_id":…,
//! "last_id":…,"sealed_at":"…","digest":"…","signature":…,"key_id":…}`
//! (`signature` and `key_id` null on an unsigned seal). A line cut short (a
//! crash in the middle of a write: it does not end in `}`) is counted and
//! skipped when read, and the next append starts on a fresh line.

use crate::store::AuditSeal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The `type` of every anchor line.
pub const ANCHOR_TYPE: &str = "oncegate-audit-anchor";

/// What is anchored of one seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    #[serde(rename = "type")]
    pub kind: String,
    pub seq: i64,
    pub first_id: i64,
    pub last_id: i64,
    pub sealed_at: String,
    pub digest: String,
    pub signature: Option<String>,
    pub key_id: Option<String>,
}

impl Anchor {
    pub fn of(seal: &AuditSeal) -> Self {
        Self {
            kind: ANCHOR_TYPE.to_string(),
            seq: seal.seq,
            first_id: seal.first_id,
            last_id: seal.last_id,
            sealed_at: crate::time_fmt::rfc3339(seal.sealed_at),
            digest: seal.digest.clone(),
            signature: seal.signature.clone(),
            key_id: seal.key_id.clone(),
        }
    }

    /// How a seal in the chain differs from this anchor (empty: it does not).
    pub fn differences(&self, chain: &Anchor) -> Vec<String> {
        let mut why = Vec::new();
        if chain.digest != self.digest {
            why.push(format!(
                "digest {} in the chain, {} anchored",
                chain.digest, self.digest
            ));
        }
        if (chain.first_id, chain.last_id) != (self.first_id, self.last_id) {
            why.push(format!(
                "ids {}..{} in the chain, {}..{} anchored",
                chain.first_id, chain.last_id, self.first_id, self.last_id
            ));
        }
        if chain.sealed_at != self.sealed_at {
            why.push(format!(
                "sealed at {} in the chain, {} anchored",
                chain.sealed_at, self.sealed_at
            ));
        }
        if (&chain.signature, &chain.key_id) != (&self.signature, &self.key_id) {
            why.push("its signature or key id differs from the anchored one".to_string());
        }
        why
    }
}

/// The anchor file a sealer appends to.
#[derive(Debug)]
pub struct AnchorFile {
    path: PathBuf,
    inner: Mutex<Appender>,
}

#[derive(Debug)]
struct Appender {
    file: std::fs::File,
    /// Anchors a failed append left behind; written before the next ones.
    waiting: Vec<Anchor>,
}

impl AnchorFile {
    /// Opens (or creates) `path` for appending; a torn last line is closed
    /// with a newline so the next anchor starts on its own line.
    pub fn open(path: &Path) -> Result<Self, String> {
        let err = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(std::io::SeekFrom::Start(len - 1)).map_err(err)?;
            file.read_exact(&mut last).map_err(err)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")
                    .and_then(|_| file.sync_data())
                    .map_err(err)?;
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            inner: Mutex::new(Appender {
                file,
                waiting: Vec::new(),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `anchors` (after any a failed append left) and syncs the file
    /// to disk; on failure they are kept for the next append.
    pub fn append(&self, anchors: Vec<Anchor>) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.waiting.extend(anchors);
        let mut text = String::new();
        for a in &inner.waiting {
            text.push_str(&serde_json::to_string(a).expect("an anchor serializes"));
            text.push('\n');
        }
        inner.file.write_all(text.as_bytes())?;
        inner.file.sync_data()?;
        inner.waiting.clear();
        Ok(())
    }

    /// [`Self::append`] off the async runtime's threads.
    pub async fn append_blocking(self: &Arc<Self>, anchors: Vec<Anchor>) -> std::io::Result<()> {
        let file = self.clone();
        tokio::task::spawn_blocking(move || file.append(anchors))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// Anchors read back, by seal number (a number anchored twice keeps both).
#[derive(Debug, Clone, Default)]
pub struct Anchors {
    pub by_seq: BTreeMap<i64, Vec<Anchor>>,
    /// Where they came from, for the report.
    pub source: String,
    /// Lines cut short by a crash in the middle of a write, skipped.
    pub torn: usize,
}

impl Anchors {
    /// Parses anchor lines; an unreadable line is an error naming it,
    /// except a line cut short (not ending in `}`), which is skipped.
    pub fn parse(source: &str, text: &str) -> Result<Self, String> {
        let mut out = Anchors {
            source: source.to_string(),
            ..Anchors::default()
        };
        for (n, line) in text.split('\n').enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Anchor>(line) {
                Ok(a) if a.kind == ANCHOR_TYPE => out.push(a),
                Ok(a) => {
                    return Err(format!(
                        "{source} line {}: type {:?}, not {ANCHOR_TYPE:?}",
                        n + 1,
                        a.kind
                    ));
                }
                Err(_) if !line.trim_end().ends_with('}') => out.torn += 1,
                Err(e) => return Err(format!("{source} line {}: not an anchor ({e})", n + 1)),
            }
        }
        Ok(out)
    }

    /// Reads an anchor file.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&path.display().to_string(), &text)
    }

    pub fn push(&mut self, anchor: Anchor) {
        let same = self.by_seq.entry(anchor.seq).or_default();
        if !same.contains(&anchor) {
            same.push(anchor);
        }
    }

    pub fn newest(&self) -> Option<i64> {
        self.by_seq.keys().next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(seq: i64) -> Anchor {
        Anchor {
            kind: ANCHOR_TYPE.into(),
            seq,
            first_id: seq * 10 - 9,
            last_id: seq * 10,
            sealed_at: "2026-11-29T10:00:00.000000Z".into(),
            digest: format!("{seq:064}"),
            signature: None,
            key_id: None,
        }
    }

    #[test]
    fn appended_anchors_read_back_and_a_torn_line_is_skipped_then_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("anchors.jsonl");
        let file = AnchorFile::open(&path).unwrap();
        file.append(vec![anchor(1), anchor(2)]).unwrap();
        drop(file);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"type\":\"oncegate-audit-anc")
            .unwrap();
        let read = Anchors::read(&path).unwrap();
        assert_eq!(read.torn, 1);
        assert_eq!(read.by_seq.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        AnchorFile::open(&path).unwrap().append(vec![anchor(3)]).unwrap();
        let read = Anchors::read(&path).unwrap();
        assert_eq!((read.torn, read.newest()), (1, Some(3)));
        let err = Anchors::parse("x", "{\"seq\":1}\n").unwrap_err();
        assert!(err.contains("line 1: not an anchor"), "{err}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with(&format!("{}\n", serde_json::to_string(&anchor(3)).unwrap())));
    }

    #[test]
    fn a_line_of_another_type_is_refused_by_line_number() {
        let err = Anchors::parse("x", "{\"type\":\"seal\",\"seq\":1}\n").unwrap_err();
        assert!(err.starts_with("x line 1:"), "{err}");
        let a = anchor(1);
        let mut b = a.clone();
        b.digest = "f".repeat(64);
        assert_eq!(a.differences(&a), Vec::<String>::new());
        assert!(a.differences(&b)[0].starts_with("digest ffff"));
    }
}

//! The audit spool (`ONCEGATE_AUDIT_SPOOL_DIR`): every row the audit queue
//! takes is first appended to a local file with one `write(2)`, so a process
//! kill (SIGKILL, the OOM killer) loses none of the rows still waiting in
//! memory; they are read back and written on the next start.
//!
//! - Rows are numbered, ascending across restarts, and appended as JSON
//!   lines to the current segment `seg-<first number>.jsonl`. The flusher
//!   closes the segment on every flush interval and syncs it to disk
//!   (`fsync`), so a node crash loses at most the rows of the last interval
//!   that had not reached the database; `oncegate_audit_spool_unsynced_rows`
//!   is that exposure.
//! - After each write to the database the highest number written is
//!   recorded in `flushed` (write and rename), and closed segments wholly at
//!   or below it are deleted. On start, rows above it are loaded back (a
//!   kill between a database commit and that record can write that batch
//!   twice, never lose it) and numbering continues after the highest.
//! - One process per directory: the pod's own `emptyDir`.

use crate::store::{AuditDecision, AuditEntry, Tier};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;

/// A spooled row.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    n: u64,
    /// Microseconds since the epoch.
    at: i64,
    decision: String,
    tier: Option<String>,
    key_prefix: String,
    award_id: String,
    instance: String,
    payload_changed: bool,
    detail: Option<String>,
}

const DECISIONS: [AuditDecision; 10] = [
    AuditDecision::Processed,
    AuditDecision::Duplicate,
    AuditDecision::Rejected,
    AuditDecision::EffectAcquired,
    AuditDecision::EffectCompleted,
    AuditDecision::EffectReleased,
    AuditDecision::EffectRetaken,
    AuditDecision::EffectRejected,
    AuditDecision::EffectAnswered,
    AuditDecision::Redriven,
];
const TIERS: [Tier; 3] = [Tier::LocalCache, Tier::Redis, Tier::Database];

impl Line {
    fn of(n: u64, e: &AuditEntry) -> Self {
        Self {
            n,
            at: (e.at.unix_timestamp_nanos() / 1_000) as i64,
            decision: e.decision.as_str().to_string(),
            tier: e.tier.map(|t| t.as_str().to_string()),
            key_prefix: e.key_prefix.clone(),
            award_id: e.award_id.clone(),
            instance: e.instance.to_string(),
            payload_changed: e.payload_changed,
            detail: e.detail.clone(),
        }
    }

    fn entry(self) -> Option<(u64, AuditEntry)> {
        let decision = DECISIONS.into_iter().find(|d| d.as_str() == self.decision)?;
        let tier = match &self.tier {
            Some(t) => Some(TIERS.into_iter().find(|x| x.as_str() == t)?),
            None => None,
        };
        let at = OffsetDateTime::from_unix_timestamp_nanos(self.at as i128 * 1_000).ok()?;
        Some((
            self.n,
            AuditEntry {
                at,
                decision,
                tier,
                key_prefix: self.key_prefix,
                award_id: self.award_id,
                instance: Arc::from(self.instance),
                payload_changed: self.payload_changed,
                detail: self.detail,
            },
        ))
    }
}

/// The spool directory of one process.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    inner: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    file: File,
    path: PathBuf,
    /// The next row's number.
    next: u64,
    /// Rows in the current segment (written, not yet synced).
    rows: u64,
    /// Bytes of whole rows in the current segment.
    bytes: u64,
    /// Closed segments and the last number each holds.
    closed: Vec<(PathBuf, u64)>,
}

/// Rows a start found in the spool, to write before anything new.
pub type Replayed = Vec<(u64, AuditEntry)>;

impl Spool {
    /// Opens `dir` (created if missing): loads the rows not yet written and
    /// starts a new segment after them.
    pub fn open(dir: &Path) -> Result<(Arc<Self>, Replayed), String> {
        let err = |e: std::io::Error| format!("{}: {e}", dir.display());
        std::fs::create_dir_all(dir).map_err(err)?;
        let flushed = read_flushed(dir)?;
        let mut rows = Vec::new();
        let (mut closed, mut highest, mut torn) = (Vec::new(), flushed, 0u64);
        for path in segments(dir).map_err(err)? {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut last = 0;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Line>(line).ok().and_then(Line::entry) {
                    Some((n, entry)) => {
                        last = last.max(n);
                        if n > flushed {
                            rows.push((n, entry));
                        }
                    }
                    None => torn += 1,
                }
            }
            highest = highest.max(last);
            if last == 0 {
                // Nothing readable in it (a segment opened just before a kill).
                std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            } else {
                closed.push((path, last));
            }
        }
        if torn > 0 {
            metrics::counter!("oncegate_audit_spool_unreadable_total").increment(torn);
            tracing::warn!(lines = torn, dir = %dir.display(), "audit spool lines cut short or unreadable were skipped");
        }
        rows.sort_by_key(|(n, _)| *n);
        let next = highest + 1;
        let (file, path) = new_segment(dir, next).map_err(err)?;
        let spool = Self {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Current {
                file,
                path,
                next,
                rows: 0,
                bytes: 0,
                closed,
            }),
        };
        Ok((Arc::new(spool), rows))
    }

    /// Numbers `entry`, appends it with one write and hands it to `send`
    /// with the write's error, if it failed, under one lock so that numbers
    /// reach the queue in order. A failed write (a full disk) is cut back
    /// off the segment, so no torn line sits before the next one; the row
    /// is then not in the spool, and `send` decides where it goes.
    pub fn append<R>(
        &self,
        entry: AuditEntry,
        send: impl FnOnce(u64, AuditEntry, Option<&std::io::Error>) -> R,
    ) -> R {
        let mut cur = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let n = cur.next;
        cur.next += 1;
        let mut line = serde_json::to_vec(&Line::of(n, &entry)).expect("a row serializes");
        line.push(b'\n');
        match cur.file.write_all(&line) {
            Ok(()) => {
                cur.rows += 1;
                cur.bytes += line.len() as u64;
                send(n, entry, None)
            }
            Err(e) => {
                metrics::counter!("oncegate_audit_spool_errors_total").increment(1);
                let _ = cur.file.set_len(cur.bytes);
                send(n, entry, Some(&e))
            }
        }
    }

    /// Closes the current segment, if it holds rows, and syncs it to disk;
    /// returns the rows synced (those a node crash just before would have
    /// lost).
    pub fn sync(&self) -> std::io::Result<u64> {
        let (old, path, rows) = {
            let mut cur = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if cur.rows == 0 {
                return Ok(0);
            }
            let rows = cur.rows;
            let first = cur.next;
            let (file, new_path) = new_segment(&self.dir, first)?;
            let old = std::mem::replace(&mut cur.file, file);
            let path = std::mem::replace(&mut cur.path, new_path);
            cur.closed.push((path.clone(), first - 1));
            cur.rows = 0;
            cur.bytes = 0;
            (old, path, rows)
        };
        old.sync_data()
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        Ok(rows)
    }

    /// Records that every row numbered up to `through` is in the database
    /// and deletes the closed segments wholly at or below it.
    ///
    /// The segments go first: their rows are in the database whatever the
    /// record says, and on a full disk deleting them is what makes room
    /// for the record.
    pub fn flushed(&self, through: u64) -> std::io::Result<()> {
        let done: Vec<PathBuf> = {
            let mut cur = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let (done, keep) = std::mem::take(&mut cur.closed)
                .into_iter()
                .partition(|(_, last)| *last <= through);
            cur.closed = keep;
            done.into_iter().map(|(p, _)| p).collect()
        };
        for path in done {
            std::fs::remove_file(&path)?;
        }
        let tmp = self.dir.join("flushed.tmp");
        std::fs::write(&tmp, through.to_string())?;
        std::fs::rename(&tmp, self.dir.join("flushed"))?;
        Ok(())
    }
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("seg-{first:020}.jsonl"))
}

fn new_segment(dir: &Path, first: u64) -> std::io::Result<(File, PathBuf)> {
    let path = segment_path(dir, first);
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)?;
    Ok((file, path))
}

/// The segments in `dir`, oldest first.
fn segments(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("seg-") && name.ends_with(".jsonl") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn read_flushed(dir: &Path) -> Result<u64, String> {
    let path = dir.join("flushed");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a row number: {:?}", path.display(), text.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(award: &str) -> AuditEntry {
        AuditEntry {
            at: OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap(),
            decision: AuditDecision::Duplicate,
            tier: Some(Tier::LocalCache),
            key_prefix: "0123456789ab".into(),
            award_id: award.into(),
            instance: Arc::from("it"),
            payload_changed: false,
            detail: None,
        }
    }

    #[test]
    fn rows_not_flushed_come_back_in_order_and_numbering_continues() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, replayed) = Spool::open(dir.path()).unwrap();
        assert!(replayed.is_empty());
        let mut sent = Vec::new();
        for i in 0..5 {
            spool.append(entry(&format!("A-{i}")), |n, _, _| sent.push(n));
        }
        assert_eq!(sent, vec![1, 2, 3, 4, 5]);
        spool.sync().unwrap();
        spool.append(entry("A-5"), |n, _, _| sent.push(n));
        spool.flushed(2).unwrap();
        drop(spool);
        // A kill: rows 3..6 were not written; the torn line is skipped.
        let last = segments(dir.path()).unwrap().pop().unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(last)
            .unwrap()
            .write_all(b"{\"n\":7,\"at\"")
            .unwrap();
        let (spool, replayed) = Spool::open(dir.path()).unwrap();
        let got: Vec<(u64, String)> = replayed.into_iter().map(|(n, e)| (n, e.award_id)).collect();
        assert_eq!(
            got,
            vec![
                (3, "A-2".into()),
                (4, "A-3".into()),
                (5, "A-4".into()),
                (6, "A-5".into())
            ]
        );
        spool.append(entry("B"), |n, _, _| assert_eq!(n, 7));
        spool.sync().unwrap();
        spool.flushed(7).unwrap();
        assert_eq!(
            segments(dir.path()).unwrap().len(),
            1,
            "only the new, empty segment"
        );
        let (_, replayed) = Spool::open(dir.path()).unwrap();
        assert!(replayed.is_empty());
    }
}

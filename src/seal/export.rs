//! Exports: sealed rows, their seals and purge records as JSON Lines,
//! readable without oncegate (`docs/AUDIT.md`, "Verify and export";
//! `scripts/verify-audit-export` checks one in plain Python).
//!
//! A file starts with a header line (`"type": "oncegate-audit-export"`,
//! the seals it holds), then each seal in order: its `seal` line, a `row`
//! line per row it covers (in id order), a `purge` line per purge record.
//! Values are the canonical texts ([`super::canonical`]), so hashing them
//! as they stand reproduces the digests. Only sealed rows are exported.
//! To a directory: one file per month in which the seals were made,
//! `audit-YYYY-MM.jsonl`, each complete in itself.

use super::canonical::{RowText, SealText};
use super::verify::{Checker, Checks, VerifyReport};
use crate::error::StoreError;
use crate::store::{AuditPurge, AuditRecord, AuditSeal, AuditStore, RowCursor, TimeRange};
use crate::time_fmt::rfc3339;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufWriter};

/// The value of a header line's `type`.
pub const HEADER_TYPE: &str = "oncegate-audit-export";

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line}: {why}")]
    Malformed { path: PathBuf, line: usize, why: String },
    #[error("{0} exists already; an export never overwrites a file")]
    Exists(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One line of an export.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Line {
    #[serde(rename = "oncegate-audit-export")]
    Header(HeaderLine),
    #[serde(rename = "seal")]
    Seal(SealLine),
    #[serde(rename = "row")]
    Row(RowLine),
    #[serde(rename = "purge")]
    Purge(PurgeLine),
}

#[derive(Debug, Serialize, Deserialize)]
struct HeaderLine {
    version: u32,
    /// The first and last seal in this file.
    first_seal: i64,
    last_seal: i64,
    exported_at: String,
    encoding: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct SealLine {
    seq: i64,
    first_id: i64,
    last_id: i64,
    row_count: i64,
    absent_ids: String,
    min_at: String,
    max_at: String,
    sealed_at: String,
    sealed_by: String,
    prev_digest: String,
    digest: String,
    /// Hex.
    row_tags: String,
    /// Absent on an unsigned seal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signature: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RowLine {
    id: i64,
    at: String,
    decision: String,
    tier: Option<String>,
    key_prefix: String,
    award_id: String,
    instance: String,
    payload_changed: bool,
    detail: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PurgeLine {
    seal_seq: Option<i64>,
    seal_digest: Option<String>,
    row_count: i64,
    ids: String,
    cutoff: String,
    purged_at: String,
    method: String,
}

impl From<&AuditSeal> for SealLine {
    fn from(s: &AuditSeal) -> Self {
        let t = SealText::from(s);
        Self {
            seq: t.seq,
            first_id: t.first_id,
            last_id: t.last_id,
            row_count: t.row_count,
            absent_ids: t.absent_ids,
            min_at: t.min_at,
            max_at: t.max_at,
            sealed_at: t.sealed_at,
            sealed_by: t.sealed_by,
            prev_digest: t.prev_digest,
            digest: t.digest,
            row_tags: hex::encode(&t.row_tags),
            signature: t.signature,
            key_id: t.key_id,
        }
    }
}

impl SealLine {
    fn text(self) -> Result<SealText, String> {
        Ok(SealText {
            row_tags: hex::decode(&self.row_tags).map_err(|e| format!("row_tags is not hex: {e}"))?,
            seq: self.seq,
            first_id: self.first_id,
            last_id: self.last_id,
            row_count: self.row_count,
            absent_ids: self.absent_ids,
            min_at: self.min_at,
            max_at: self.max_at,
            sealed_at: self.sealed_at,
            sealed_by: self.sealed_by,
            prev_digest: self.prev_digest,
            digest: self.digest,
            signature: self.signature,
            key_id: self.key_id,
        })
    }
}

impl From<&AuditRecord> for RowLine {
    fn from(r: &AuditRecord) -> Self {
        Self {
            id: r.id,
            at: rfc3339(r.at),
            decision: r.decision.clone(),
            tier: r.tier.clone(),
            key_prefix: r.key_prefix.clone(),
            award_id: r.award_id.clone(),
            instance: r.instance.clone(),
            payload_changed: r.payload_changed,
            detail: r.detail.clone(),
        }
    }
}

impl RowLine {
    fn text(self) -> RowText {
        RowText {
            id: self.id,
            values: vec![
                Some(self.id.to_string()),
                Some(self.at),
                Some(self.decision),
                self.tier,
                Some(self.key_prefix),
                Some(self.award_id),
                Some(self.instance),
                Some(self.payload_changed.to_string()),
                self.detail,
            ],
        }
    }
}

impl From<&AuditPurge> for PurgeLine {
    fn from(p: &AuditPurge) -> Self {
        Self {
            seal_seq: p.seal_seq,
            seal_digest: p.seal_digest.clone(),
            row_count: p.row_count,
            ids: p.ids.clone(),
            cutoff: rfc3339(p.cutoff),
            purged_at: rfc3339(p.purged_at),
            method: p.method.clone(),
        }
    }
}

impl PurgeLine {
    fn record(self) -> Result<AuditPurge, String> {
        let time = |s: &str| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))
        };
        Ok(AuditPurge {
            purged_at: time(&self.purged_at)?,
            cutoff: time(&self.cutoff)?,
            method: self.method,
            seal_seq: self.seal_seq,
            seal_digest: self.seal_digest,
            row_count: self.row_count,
            ids: self.ids,
        })
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub files: Vec<PathBuf>,
    pub seals: u64,
    pub rows: u64,
    /// The newest seal written and its digest.
    pub latest: Option<(i64, String)>,
}

/// Where the seals go: one file, or a file per month in a directory.
pub enum Target {
    File(PathBuf),
    Monthly(PathBuf),
}

impl Target {
    /// A path naming an existing directory, or ending in `/`, is a directory.
    pub fn for_path(path: &Path) -> Self {
        if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
            Self::Monthly(path.to_path_buf())
        } else {
            Self::File(path.to_path_buf())
        }
    }

    fn file_for(&self, seal: &AuditSeal, month: &mut String) -> PathBuf {
        match self {
            Self::File(p) => p.clone(),
            Self::Monthly(dir) => {
                // In seal order even if an instance's clock lagged.
                let m = format!("{:04}-{:02}", seal.sealed_at.year(), seal.sealed_at.month() as u8);
                if m > *month {
                    *month = m;
                }
                dir.join(format!("audit-{month}.jsonl"))
            }
        }
    }
}

/// An output file being written (under a temporary name until complete).
struct OutFile {
    path: PathBuf,
    partial: PathBuf,
    body: BufWriter<tokio::fs::File>,
    first_seal: i64,
    last_seal: i64,
}

impl OutFile {
    async fn create(path: PathBuf, first_seal: i64) -> Result<Self, ExportError> {
        if tokio::fs::try_exists(&path).await.map_err(io(&path))? {
            return Err(ExportError::Exists(path));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
        }
        let partial = path.with_extension("jsonl.partial");
        let file = tokio::fs::File::create(&partial).await.map_err(io(&partial))?;
        Ok(Self {
            path,
            partial,
            body: BufWriter::new(file),
            first_seal,
            last_seal: first_seal,
        })
    }

    async fn line(&mut self, line: &Line) -> Result<(), ExportError> {
        let mut text = serde_json::to_string(line).expect("export lines serialize");
        text.push('\n');
        self.body
            .write_all(text.as_bytes())
            .await
            .map_err(io(&self.partial))
    }

    /// The header (written last, put first), then the body: the file is
    /// complete under its own name or not there at all.
    async fn finish(mut self) -> Result<PathBuf, ExportError> {
        self.body.flush().await.map_err(io(&self.partial))?;
        let header = Line::Header(HeaderLine {
            version: 1,
            first_seal: self.first_seal,
            last_seal: self.last_seal,
            exported_at: rfc3339(crate::time_fmt::now_micros()),
            encoding: "oncegate audit seal v1 (docs/AUDIT.md: The canonical encoding)".into(),
        });
        let mut text = serde_json::to_string(&header).expect("export lines serialize");
        text.push('\n');
        let mut body = tokio::fs::File::open(&self.partial)
            .await
            .map_err(io(&self.partial))?;
        let mut out = tokio::fs::File::create_new(&self.path)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => ExportError::Exists(self.path.clone()),
                _ => io(&self.path)(e),
            })?;
        out.write_all(text.as_bytes()).await.map_err(io(&self.path))?;
        tokio::io::copy(&mut body, &mut out)
            .await
            .map_err(io(&self.path))?;
        out.sync_all().await.map_err(io(&self.path))?;
        tokio::fs::remove_file(&self.partial)
            .await
            .map_err(io(&self.partial))?;
        Ok(self.path)
    }
}

/// Writes the seals whose rows overlap `range`, each with its rows and
/// purge records, to `target`. `progress` hears (rows done, rows total).
pub async fn export(
    store: &dyn AuditStore,
    range: &TimeRange,
    target: &Target,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<ExportSummary, ExportError> {
    let mut summary = ExportSummary::default();
    let Some(span) = store.audit_seal_span(range).await? else {
        return Ok(summary);
    };
    let (mut next, mut month, mut out) = (span.first_seq, String::new(), None::<OutFile>);
    while next <= span.last_seq {
        let seals = store.audit_seals(next, 64).await?;
        let Some(last) = seals.last() else { break };
        next = last.seq + 1;
        for seal in seals.iter().filter(|s| s.seq <= span.last_seq) {
            let path = target.file_for(seal, &mut month);
            if out.as_ref().is_some_and(|o| o.path != path) {
                summary.files.push(out.take().expect("checked").finish().await?);
            }
            if out.is_none() {
                out = Some(OutFile::create(path, seal.seq).await?);
            }
            let file = out.as_mut().expect("opened");
            summary.rows += write_seal(store, seal, file).await?;
            file.last_seal = seal.seq;
            summary.seals += 1;
            summary.latest = Some((seal.seq, seal.digest.clone()));
            progress(summary.rows, span.rows.max(0) as u64);
        }
    }
    if let Some(file) = out {
        summary.files.push(file.finish().await?);
    }
    Ok(summary)
}

/// One seal's lines; returns the rows written.
async fn write_seal(store: &dyn AuditStore, seal: &AuditSeal, out: &mut OutFile) -> Result<u64, ExportError> {
    out.line(&Line::Seal(SealLine::from(seal))).await?;
    let mut rows = 0u64;
    let mut cursor = RowCursor::after_id(seal.first_id - 1);
    loop {
        let page = store.audit_rows(cursor, seal.last_id, 10_000).await?;
        for row in &page {
            out.line(&Line::Row(RowLine::from(row))).await?;
        }
        rows += page.len() as u64;
        match page.last() {
            Some(row) if page.len() == 10_000 => cursor = RowCursor::after(row),
            _ => break,
        }
    }
    if (rows as i64) < seal.row_count {
        for p in store.audit_purges(Some((seal.seq, seal.seq))).await? {
            out.line(&Line::Purge(PurgeLine::from(&p))).await?;
        }
    }
    Ok(rows)
}

/// The export files at `path`: the file, or a directory's `*.jsonl` by name.
async fn export_files(path: &Path) -> Result<Vec<PathBuf>, ExportError> {
    if !tokio::fs::metadata(path).await.map_err(io(path))?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut dir = tokio::fs::read_dir(path).await.map_err(io(path))?;
    while let Some(entry) = dir.next_entry().await.map_err(io(path))? {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "jsonl") {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// A seal read from an export, with the lines that followed it.
struct Pending {
    seal: SealText,
    rows: Vec<RowText>,
    purges: Vec<AuditPurge>,
}

/// An export's lines fed to the checker, seal by seal.
#[derive(Default)]
struct Replay {
    checks: Checks,
    checker: Option<Checker>,
    pending: Option<Pending>,
    /// The last seal any header lists.
    last_listed: i64,
    rows: u64,
}

impl Replay {
    fn line(&mut self, line: Line) -> Result<(), String> {
        // A whole-chain export's first header lists seal 1.
        let checks = &self.checks;
        let checker = self.checker.get_or_insert_with(|| {
            Checker::new(matches!(&line, Line::Header(h) if h.first_seal == 1))
                .with_keys(checks.keys.clone())
                .with_anchors(checks.anchors.clone(), false)
        });
        match line {
            Line::Header(h) => self.last_listed = self.last_listed.max(h.last_seal),
            Line::Seal(s) => {
                let seal = s.text()?;
                if let Some(p) = self.pending.replace(Pending {
                    seal,
                    rows: Vec::new(),
                    purges: Vec::new(),
                }) {
                    self.rows += p.rows.len() as u64;
                    checker.seal(&p.seal, &p.rows, &p.purges);
                }
            }
            Line::Row(r) => match self.pending.as_mut() {
                Some(p) => p.rows.push(r.text()),
                None => checker.outside(&r.text()),
            },
            Line::Purge(p) => {
                let record = p.record()?;
                if let Some(pending) = self.pending.as_mut() {
                    pending.purges.push(record);
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> VerifyReport {
        let mut checker = self.checker.unwrap_or_else(|| {
            Checker::new(false)
                .with_keys(self.checks.keys)
                .with_anchors(self.checks.anchors, false)
        });
        if let Some(p) = self.pending {
            checker.seal(&p.seal, &p.rows, &p.purges);
        }
        checker.truncated(self.last_listed);
        checker.finish(None, 0)
    }
}

/// Verifies an export (a file, or a directory of monthly files) as
/// [`super::verify::verify_store`] verifies the store. A whole-chain export
/// (its first header lists seal 1) must start at seal 1; another continues
/// from its first seal's previous digest, taken as given. `progress` hears
/// (rows read, 0).
pub async fn verify_export(
    path: &Path,
    checks: Checks,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<VerifyReport, ExportError> {
    let mut replay = Replay {
        checks,
        ..Replay::default()
    };
    for file in export_files(path).await? {
        let reader = tokio::fs::File::open(&file).await.map_err(io(&file))?;
        let mut lines = tokio::io::BufReader::new(reader).lines();
        let mut n = 0usize;
        while let Some(text) = lines.next_line().await.map_err(io(&file))? {
            n += 1;
            if text.trim().is_empty() {
                continue;
            }
            let malformed = |why: String| ExportError::Malformed {
                path: file.clone(),
                line: n,
                why,
            };
            let line: Line = serde_json::from_str(&text).map_err(|e| malformed(e.to_string()))?;
            replay.line(line).map_err(malformed)?;
            if n.is_multiple_of(10_000) {
                progress(replay.rows, 0);
            }
        }
    }
    Ok(replay.finish())
}

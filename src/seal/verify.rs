//! Verification: recompute the chain, seal by seal, and name every row or
//! seal that no longer matches.
//!
//! A seal knows its id range, which ids in it held no row (`absent_ids`),
//! how many rows it covered and the first 4 bytes of each one's hash. So a
//! row can be named exactly: changed (its hash no longer starts with its
//! tag), removed (an id the seal covered has no row and no purge record
//! lists it), inserted afterwards (an id the seal found absent, a second row
//! with one id, or an id below the first seal). With every row in place the
//! digest is recomputed: a mismatch then means the seal itself was changed.
//! Each seal must continue the previous one (its number, its range and its
//! previous digest): a gap is a missing seal. Rows a purge record lists are
//! "purged under the retention policy", never "missing"; their seal's digest
//! can no longer be recomputed, but its link to the next seal still holds.

use super::anchor::{Anchor, Anchors};
use super::canonical::{RowText, SealText};
use super::signing::{Keyring, SignatureProblem};
use crate::error::StoreError;
use crate::store::shared::{GENESIS_DIGEST, IdRanges};
use crate::store::{AuditPurge, AuditStore, RowCursor, RowSpan, TimeRange};
use std::fmt;
use std::time::Duration;
use time::OffsetDateTime;

/// Findings kept for the report (all are counted).
const MAX_FINDINGS: usize = 1_000;

/// One row or seal that does not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The row's content is not what its seal covered.
    RowChanged { id: i64, seal: i64 },
    /// The seal covered the row; it is gone and no purge record lists it.
    RowRemoved { id: i64, seal: i64 },
    /// A row no seal covered where one did (or below the first seal).
    RowInserted {
        id: i64,
        seal: Option<i64>,
        why: &'static str,
    },
    /// The seal's own fields or digest no longer match.
    SealChanged { seal: i64, why: String },
    /// Seals between two numbers are gone.
    SealsMissing { after: i64, next: i64, ids: (i64, i64) },
    /// An export ends before the last seal its header lists.
    ExportTruncated { after: i64, last: i64 },
    /// The seal's signature does not hold under the given public keys.
    SignatureBad { seal: i64, why: String },
    /// The seal carries no signature although an earlier one did.
    SignatureMissing { seal: i64, first_signed: i64 },
    /// Public keys were given, but no seal checked carries a signature.
    NothingSigned,
    /// The seal in the chain is not the seal anchored outside the database.
    AnchorDisagrees { seal: i64, why: String },
    /// Seals anchored outside the database that the chain lacks: its
    /// newest seals cut off (with their rows), or seals removed.
    AnchoredSealsMissing {
        first: i64,
        last: i64,
        chain_ends: Option<i64>,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RowChanged { id, seal } => {
                write!(
                    f,
                    "row {id} (seal {seal}) changed: its content no longer matches the seal"
                )
            }
            Self::RowRemoved { id, seal } => write!(
                f,
                "row {id} (seal {seal}) removed: the seal covers it, it is missing, and no purge record lists it"
            ),
            Self::RowInserted {
                id,
                seal: Some(seal),
                why,
            } => {
                write!(f, "row {id} (seal {seal}) inserted afterwards: {why}")
            }
            Self::RowInserted { id, seal: None, why } => write!(f, "row {id} inserted afterwards: {why}"),
            Self::SealChanged { seal, why } => write!(f, "seal {seal} changed: {why}"),
            Self::SealsMissing { after: 0, next, ids } => write!(
                f,
                "seals 1..{} missing: the chain starts at seal {next}; ids {}..{} are covered by no seal",
                next - 1,
                ids.0,
                ids.1
            ),
            Self::SealsMissing { after, next, ids } if next - after == 2 => write!(
                f,
                "seal {} missing: seal {after} is followed by seal {next}; ids {}..{} are covered by no seal",
                after + 1,
                ids.0,
                ids.1
            ),
            Self::SealsMissing { after, next, ids } => write!(
                f,
                "seals {}..{} missing: seal {after} is followed by seal {next}; ids {}..{} are covered by no seal",
                after + 1,
                next - 1,
                ids.0,
                ids.1
            ),
            Self::SignatureBad { seal, why } => write!(f, "seal {seal} signature refused: {why}"),
            Self::SignatureMissing { seal, first_signed } => write!(
                f,
                "seal {seal} unsigned: seal {first_signed} and every seal after it must carry a signature"
            ),
            Self::NothingSigned => write!(
                f,
                "no seal carries a signature although --public-key was given (signatures stripped, or signing never enabled)"
            ),
            Self::AnchorDisagrees { .. } | Self::AnchoredSealsMissing { .. } => self.fmt_anchor(f),
            Self::ExportTruncated { after, last } => write!(
                f,
                "seals {}..{last} missing: the export ends after seal {after} but its header lists seals up to {last}",
                after + 1
            ),
        }
    }
}

impl Finding {
    /// The findings against anchors.
    fn fmt_anchor(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AnchorDisagrees { seal, why } => {
                write!(f, "seal {seal} does not match its anchor: {why}")
            }
            Self::AnchoredSealsMissing {
                first,
                last,
                chain_ends: Some(end),
            } => write!(
                f,
                "{} missing: anchored outside the database, but the chain ends at seal {end}",
                seal_range(*first, *last)
            ),
            Self::AnchoredSealsMissing { first, last, .. } => write!(
                f,
                "{} missing: anchored outside the database, but the chain holds no seal",
                seal_range(*first, *last)
            ),
            _ => Ok(()),
        }
    }
}

/// What a verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// The first and last seal checked.
    pub seals: Option<(i64, i64)>,
    pub seals_checked: u64,
    /// Rows found in place and matching.
    pub rows_checked: u64,
    /// When the check began after seal 1: the digest it continues from,
    /// taken as given.
    pub anchor: Option<(i64, String)>,
    /// Seals whose rows are all purged, and the rows they held.
    pub purged_seals: u64,
    pub purged_rows: u64,
    /// Seals with some rows purged and some left (a purge under way).
    pub partly_purged_seals: u64,
    /// The shortest retention a purge used (purge time minus its cutoff).
    pub min_retention: Option<Duration>,
    /// Rows purged before any seal covered them.
    pub purged_unsealed_rows: i64,
    /// Seals compared with an anchor, and where the anchors came from.
    pub anchored: Option<(u64, String)>,
    /// Rows no seal covers yet: counted, not failed (`None` for an export,
    /// which holds sealed rows only).
    pub unsealed: Option<RowSpan>,
    /// The newest seal checked and its digest, to compare with a digest
    /// recorded elsewhere.
    pub latest: Option<(i64, String)>,
    pub findings: Vec<Finding>,
    pub findings_total: u64,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.findings_total == 0
    }
}

/// What the previous seal left for the next to continue.
struct Prev {
    seq: i64,
    last_id: i64,
    /// Its stored digest, and the recomputed one when they differ (either
    /// may be the original: a changed digest, or another changed field).
    digests: Vec<String>,
}

/// The checking, fed seal by seal in order (from the store or an export).
pub struct Checker {
    from_genesis: bool,
    /// Signatures are checked when keys are given.
    keys: Option<Keyring>,
    first_signed: Option<i64>,
    /// Seals are compared with these anchors when given.
    anchors: Option<Anchors>,
    /// The check runs to the newest seal: anchored seals past it are missing.
    to_head: bool,
    prev: Option<Prev>,
    report: VerifyReport,
}

impl Checker {
    /// `from_genesis`: the seals start at number 1 (a whole chain), so the
    /// first must be seal 1 and rows below it are inserted.
    pub fn new(from_genesis: bool) -> Self {
        Self {
            from_genesis,
            keys: None,
            first_signed: None,
            anchors: None,
            to_head: false,
            prev: None,
            report: VerifyReport::default(),
        }
    }

    /// Checks every seal's signature against `keys` (none: signatures are
    /// not checked).
    pub fn with_keys(mut self, keys: Option<Keyring>) -> Self {
        self.keys = keys;
        self
    }

    /// Compares every seal with `anchors` (none: not compared); `to_head`:
    /// the check runs to the newest seal, so anchored seals after the last
    /// one checked are missing.
    pub fn with_anchors(mut self, anchors: Option<Anchors>, to_head: bool) -> Self {
        if let Some(a) = &anchors {
            self.report.anchored = Some((0, a.source.clone()));
        }
        self.anchors = anchors;
        self.to_head = to_head;
        self
    }

    /// The seal against its anchors, when given.
    fn anchor(&mut self, seal: &SealText) {
        let Some(anchors) = &self.anchors else { return };
        let Some(anchored) = anchors.by_seq.get(&seal.seq) else {
            return;
        };
        let chain = Anchor {
            kind: super::anchor::ANCHOR_TYPE.to_string(),
            seq: seal.seq,
            first_id: seal.first_id,
            last_id: seal.last_id,
            sealed_at: seal.sealed_at.clone(),
            digest: seal.digest.clone(),
            signature: seal.signature.clone(),
            key_id: seal.key_id.clone(),
        };
        let why: Vec<String> = anchored.iter().flat_map(|a| a.differences(&chain)).collect();
        if let Some((n, _)) = self.report.anchored.as_mut() {
            *n += 1;
        }
        if !why.is_empty() {
            self.find(Finding::AnchorDisagrees {
                seal: seal.seq,
                why: why.join("; "),
            });
        }
    }

    /// Anchored seals after the last one checked, when the check ran to the
    /// newest seal.
    fn anchored_tail(&mut self) {
        let (Some(anchors), true) = (&self.anchors, self.to_head) else {
            return;
        };
        let chain_ends = self.last_seq();
        let after = chain_ends.unwrap_or(0);
        let missing: Vec<i64> = anchors.by_seq.keys().copied().filter(|s| *s > after).collect();
        if let (Some(&first), Some(&last)) = (missing.first(), missing.last()) {
            self.find(Finding::AnchoredSealsMissing {
                first,
                last,
                chain_ends,
            });
        }
    }

    /// The seal's signature, when keys are given.
    fn signature(&mut self, seal: &SealText) {
        let Some(keys) = &self.keys else { return };
        let finding = match (&seal.signature, &seal.key_id) {
            (Some(sig), Some(id)) => {
                self.first_signed.get_or_insert(seal.seq);
                match keys.check(id, sig, &seal.digest) {
                    Ok(()) => None,
                    Err(SignatureProblem::UnknownKey(id)) => Some(Finding::SignatureBad {
                        seal: seal.seq,
                        why: format!("signed by key {id}, which is not among the given public keys"),
                    }),
                    Err(SignatureProblem::Invalid(why)) => {
                        Some(Finding::SignatureBad { seal: seal.seq, why })
                    }
                }
            }
            (None, None) => self.first_signed.map(|first_signed| Finding::SignatureMissing {
                seal: seal.seq,
                first_signed,
            }),
            _ => Some(Finding::SignatureBad {
                seal: seal.seq,
                why: "it carries a signature or a key id without the other".into(),
            }),
        };
        if let Some(f) = finding {
            self.find(f);
        }
    }

    fn find(&mut self, finding: Finding) {
        self.report.findings_total += 1;
        if self.report.findings.len() < MAX_FINDINGS {
            self.report.findings.push(finding);
        }
    }

    /// A row below every sealed range.
    pub fn outside(&mut self, row: &RowText) {
        self.find(Finding::RowInserted {
            id: row.id,
            seal: None,
            why: "its id is below the first seal's range",
        });
    }

    /// Checks one seal against its rows (those with ids in its range, in
    /// `(id, at)` order) and its purge records.
    pub fn seal(&mut self, seal: &SealText, rows: &[RowText], purges: &[AuditPurge]) {
        let mut why = Vec::new();
        self.signature(seal);
        self.anchor(seal);
        self.link(seal, &mut why);
        let mut recomputed = None;
        match shape(seal) {
            Err(reason) => why.push(reason),
            Ok(absent) => {
                let rows_found = self.rows(seal, &absent, rows, purges);
                if let Some(hashes) = rows_found {
                    let digest = seal.digest_over(&hashes);
                    if digest != seal.digest {
                        why.push("its digest does not match its fields and rows".to_string());
                    }
                    recomputed = Some(digest);
                }
                self.purges(seal, purges, &recomputed, &mut why);
            }
        }
        if !why.is_empty() {
            self.find(Finding::SealChanged {
                seal: seal.seq,
                why: why.join("; "),
            });
        }
        let mut digests = vec![seal.digest.clone()];
        digests.extend(recomputed.filter(|d| *d != seal.digest));
        self.prev = Some(Prev {
            seq: seal.seq,
            last_id: seal.last_id,
            digests,
        });
        self.report.seals_checked += 1;
        let first = self.report.seals.map_or(seal.seq, |(first, _)| first);
        self.report.seals = Some((first, seal.seq));
        self.report.latest = Some((seal.seq, seal.digest.clone()));
    }

    /// Does `seal` continue the previous one?
    fn link(&mut self, seal: &SealText, why: &mut Vec<String>) {
        let Some(prev) = &self.prev else {
            if !self.from_genesis {
                self.report.anchor = Some((seal.seq - 1, seal.prev_digest.clone()));
            } else if seal.seq != 1 {
                self.find(Finding::SealsMissing {
                    after: 0,
                    next: seal.seq,
                    ids: (1, seal.first_id - 1),
                });
            } else {
                if seal.first_id != 1 {
                    why.push(format!("it starts at id {}, not at id 1", seal.first_id));
                }
                if seal.prev_digest != GENESIS_DIGEST {
                    why.push("its previous digest is not the genesis digest (64 zeros)".to_string());
                }
            }
            return;
        };
        if seal.seq != prev.seq + 1 {
            let ids = (prev.last_id + 1, seal.first_id - 1);
            let after = prev.seq;
            self.find(Finding::SealsMissing {
                after,
                next: seal.seq,
                ids,
            });
            return;
        }
        if seal.first_id != prev.last_id + 1 {
            why.push(format!(
                "it starts at id {}, but seal {} ends at id {}",
                seal.first_id, prev.seq, prev.last_id
            ));
        }
        if !prev.digests.contains(&seal.prev_digest) {
            why.push(format!("its previous digest is not seal {}'s digest", prev.seq));
        }
    }

    /// Checks the rows; returns their hashes in order when every row the
    /// seal covered is in place and unchanged.
    fn rows(
        &mut self,
        seal: &SealText,
        absent: &IdRanges,
        rows: &[RowText],
        purges: &[AuditPurge],
    ) -> Option<Vec<[u8; 32]>> {
        let n = seal.row_count as usize;
        let mut hashes: Vec<Option<[u8; 32]>> = vec![None; n];
        let mut bad = 0usize;
        for row in rows {
            let Some(pos) = position(seal, absent, row.id) else {
                bad += 1;
                let why = if absent.contains(row.id) {
                    "its id was absent when the seal was made"
                } else {
                    "its id is outside the seal's range"
                };
                self.find(Finding::RowInserted {
                    id: row.id,
                    seal: Some(seal.seq),
                    why,
                });
                continue;
            };
            if hashes[pos].is_some() {
                bad += 1;
                self.find(Finding::RowInserted {
                    id: row.id,
                    seal: Some(seal.seq),
                    why: "a second row with this id",
                });
                continue;
            }
            let hash = row.hash();
            hashes[pos] = Some(hash);
            if hash[..4] != seal.row_tags[pos * 4..pos * 4 + 4] {
                bad += 1;
                self.find(Finding::RowChanged {
                    id: row.id,
                    seal: seal.seq,
                });
            } else {
                self.report.rows_checked += 1;
            }
        }
        let purged = purged_ids(purges);
        let mut lawful = 0u64;
        for (pos, id) in expected_ids(seal, absent).enumerate() {
            if hashes[pos].is_some() {
                continue;
            }
            bad += 1;
            if purged.contains(id) {
                lawful += 1;
            } else {
                self.find(Finding::RowRemoved { id, seal: seal.seq });
            }
        }
        if lawful == n as u64 {
            self.report.purged_seals += 1;
            self.report.purged_rows += lawful;
        } else if lawful > 0 {
            self.report.partly_purged_seals += 1;
            self.report.purged_rows += lawful;
        }
        (bad == 0).then(|| hashes.into_iter().flatten().collect())
    }

    /// Purge records must be for a seal wholly older than their cutoff, and
    /// carry its digest.
    fn purges(
        &mut self,
        seal: &SealText,
        purges: &[AuditPurge],
        recomputed: &Option<String>,
        why: &mut Vec<String>,
    ) {
        let max_at = parse_time(&seal.max_at);
        for p in purges {
            if max_at.is_none_or(|t| t >= p.cutoff) {
                why.push(format!(
                    "a purge record removed its rows at cutoff {} although its newest row is from {}",
                    crate::time_fmt::rfc3339(p.cutoff),
                    seal.max_at
                ));
            }
            let copied = p.seal_digest.as_ref();
            if copied.is_some_and(|d| *d != seal.digest && recomputed.as_ref() != Some(d)) {
                why.push("its digest differs from the one its purge record copied".to_string());
            }
            let kept = (p.purged_at - p.cutoff).try_into().unwrap_or_default();
            self.report.min_retention =
                Some(self.report.min_retention.map_or(kept, |m: Duration| m.min(kept)));
        }
    }

    /// The last seal checked, if any.
    pub fn last_seq(&self) -> Option<i64> {
        self.prev.as_ref().map(|p| p.seq)
    }

    /// Records that the seals after the last one checked, up to `last`, are
    /// missing from an export.
    pub fn truncated(&mut self, last: i64) {
        let after = self.last_seq().unwrap_or(0);
        if last > after {
            self.find(Finding::ExportTruncated { after, last });
        }
    }

    /// The report, with what no seal covers yet and what was purged before
    /// a seal covered it.
    pub fn finish(mut self, unsealed: Option<RowSpan>, purged_unsealed_rows: i64) -> VerifyReport {
        if self.keys.is_some() && self.first_signed.is_none() && self.report.seals_checked > 0 {
            self.find(Finding::NothingSigned);
        }
        self.anchored_tail();
        self.report.unsealed = unsealed;
        self.report.purged_unsealed_rows = purged_unsealed_rows;
        self.report
    }
}

/// The seal's absent ids, checked against its row count and tags.
fn shape(seal: &SealText) -> Result<IdRanges, String> {
    let absent =
        IdRanges::parse(&seal.absent_ids).map_err(|e| format!("its absent ids are unreadable: {e}"))?;
    let span = seal.last_id as i128 - seal.first_id as i128 + 1;
    let expected = span - absent.count_in(seal.first_id, seal.last_id) as i128;
    if span < 1 || seal.row_count < 1 || expected != seal.row_count as i128 {
        return Err(format!(
            "its row count {} does not match its id range {}..{} less its absent ids",
            seal.row_count, seal.first_id, seal.last_id
        ));
    }
    if seal.row_tags.len() as i128 != 4 * seal.row_count as i128 {
        return Err(format!(
            "it holds {} row tags for {} rows",
            seal.row_tags.len() / 4,
            seal.row_count
        ));
    }
    Ok(absent)
}

/// The index of `id` among the ids the seal covered, if it covered it.
fn position(seal: &SealText, absent: &IdRanges, id: i64) -> Option<usize> {
    if id < seal.first_id || id > seal.last_id || absent.contains(id) {
        return None;
    }
    Some((id - seal.first_id - absent.count_in(seal.first_id, id - 1)) as usize)
}

/// The ids the seal covered, ascending.
fn expected_ids<'a>(seal: &'a SealText, absent: &'a IdRanges) -> impl Iterator<Item = i64> + 'a {
    let mut gaps = absent.ranges().iter().peekable();
    let mut id = seal.first_id;
    std::iter::from_fn(move || {
        while let Some(&&(lo, hi)) = gaps.peek() {
            if id < lo {
                break;
            }
            gaps.next();
            id = id.max(hi.saturating_add(1));
        }
        (id <= seal.last_id).then(|| {
            id += 1;
            id - 1
        })
    })
}

fn purged_ids(purges: &[AuditPurge]) -> IdRanges {
    let mut ranges: Vec<(i64, i64)> = purges
        .iter()
        .filter_map(|p| IdRanges::parse(&p.ids).ok())
        .flat_map(|r| r.ranges().to_vec())
        .collect();
    ranges.sort_unstable();
    let mut out = IdRanges::default();
    for (lo, hi) in ranges {
        out.push_range(lo, hi);
    }
    out
}

fn parse_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// What a verification checks besides the chain: signatures against public
/// keys, seals against anchors kept outside the database. Anchors must be
/// read before the verification starts (an anchor is written after its seal
/// commits, so every seal anchored by then is in the chain).
#[derive(Debug, Clone, Default)]
pub struct Checks {
    pub keys: Option<Keyring>,
    pub anchors: Option<Anchors>,
}

/// Rows read per query.
const PAGE: i64 = 10_000;
/// Seals read per query.
const SEAL_PAGE: i64 = 64;

/// Verifies the chain in the store: every seal whose rows overlap `range`
/// (all of them when it is unbounded: then from seal 1, and rows below the
/// first seal count as inserted). `progress` hears (rows done, rows total).
pub async fn verify_store(
    store: &dyn AuditStore,
    range: &TimeRange,
    checks: Checks,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<VerifyReport, StoreError> {
    let full = range.is_unbounded();
    let mut checker = Checker::new(full)
        .with_keys(checks.keys)
        .with_anchors(checks.anchors, range.to.is_none());
    if full {
        for row in store.audit_rows(RowCursor::after_id(i64::MIN), 0, 100).await? {
            checker.outside(&RowText::from(&row));
        }
    }
    // Everything is judged against the newest seal as of now: seals made
    // during the walk are left for the next verification.
    let head = store.last_audit_seal().await?;
    let sealed_through = head.as_ref().map_or(0, |h| h.last_id);
    let span = match (store.audit_seal_span(range).await?, &head) {
        (Some(span), Some(head)) if span.first_seq <= head.seq => Some((span, head.seq)),
        _ => None,
    };
    if let Some((span, last_seq)) = span {
        let (mut next, mut done) = (span.first_seq, 0u64);
        'pages: while next <= last_seq {
            let seals = store.audit_seals(next, SEAL_PAGE).await?;
            let Some(last) = seals.last() else { break };
            next = last.seq + 1;
            for seal in &seals {
                if seal.seq > last_seq.min(span.last_seq) {
                    break 'pages;
                }
                let rows = rows_of(store, seal.first_id, seal.last_id).await?;
                // Read after the rows: a purge that removed one had
                // committed its record by then.
                let purges = if (rows.len() as i64) < seal.row_count {
                    store.audit_purges(Some((seal.seq, seal.seq))).await?
                } else {
                    Vec::new()
                };
                checker.seal(&SealText::from(seal), &rows, &purges);
                done += seal.row_count.max(0) as u64;
                progress(done, span.rows.max(0) as u64);
            }
        }
    }
    let unsealed = store.audit_rows_after(sealed_through, range).await?;
    let purged_unsealed = if full {
        store.audit_purges(None).await?.iter().map(|p| p.row_count).sum()
    } else {
        0
    };
    Ok(checker.finish(Some(unsealed), purged_unsealed))
}

/// Every row with an id in `first..=last`, in pages.
async fn rows_of(store: &dyn AuditStore, first: i64, last: i64) -> Result<Vec<RowText>, StoreError> {
    let mut out = Vec::new();
    let mut cursor = RowCursor::after_id(first.saturating_sub(1));
    loop {
        let page = store.audit_rows(cursor, last, PAGE).await?;
        out.extend(page.iter().map(RowText::from));
        match page.last() {
            Some(row) if page.len() as i64 == PAGE => cursor = RowCursor::after(row),
            _ => return Ok(out),
        }
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seals {
            Some((first, last)) => writeln!(
                f,
                "{} checked: {} in place and matching",
                seal_range(first, last),
                count(self.rows_checked, "row")
            )?,
            None => writeln!(f, "no seals")?,
        }
        if let Some((seq, digest)) = &self.anchor {
            writeln!(f, "continues from seal {seq}, digest {digest} (taken as given)")?;
        }
        self.fmt_purged(f)?;
        match self.unsealed {
            Some(RowSpan {
                count: n,
                first_id: Some(lo),
                last_id: Some(hi),
            }) => writeln!(f, "not yet sealed: {} (ids {lo}..{hi})", count(n as u64, "row"))?,
            Some(_) => writeln!(f, "not yet sealed: 0 rows")?,
            None => {}
        }
        if let Some((seq, digest)) = &self.latest {
            writeln!(f, "latest digest: seal {seq} {digest}")?;
        }
        if let Some((n, source)) = &self.anchored {
            writeln!(
                f,
                "compared with their anchors in {source}: {}",
                count(*n, "seal")
            )?;
        }
        for finding in &self.findings {
            writeln!(f, "MISMATCH {finding}")?;
        }
        if self.findings_total > self.findings.len() as u64 {
            writeln!(
                f,
                "… and {} more",
                self.findings_total - self.findings.len() as u64
            )?;
        }
        match self.findings.first() {
            None => write!(f, "result: OK"),
            Some(first) => write!(
                f,
                "first mismatch: {first}\nresult: FAILED ({})",
                count(self.findings_total, "mismatch")
            ),
        }
    }
}

impl VerifyReport {
    /// The lines about lawful purges, if any.
    fn fmt_purged(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.purged_rows > 0 || self.partly_purged_seals > 0 {
            write!(
                f,
                "purged under the retention policy: {} ({} whole, {} in part)",
                count(self.purged_rows, "row"),
                count(self.purged_seals, "seal"),
                self.partly_purged_seals
            )?;
            if let Some(kept) = self.min_retention {
                let kept = Duration::from_secs(kept.as_secs() / 60 * 60);
                write!(f, ", each kept at least {}", humantime::format_duration(kept))?;
            }
            writeln!(f)?;
        }
        if self.purged_unsealed_rows > 0 {
            writeln!(
                f,
                "purged under the retention policy before they were sealed: {}",
                count(self.purged_unsealed_rows as u64, "row")
            )?;
        }
        Ok(())
    }
}

/// "seal 3" or "seals 3..7".
pub fn seal_range(first: i64, last: i64) -> String {
    if first == last {
        format!("seal {first}")
    } else {
        format!("seals {first}..{last}")
    }
}

/// "1 row", "2 rows"; "1 mismatch", "2 mismatches".
pub fn count(n: u64, what: &str) -> String {
    let plural = if what.ends_with(['s', 'h']) { "es" } else { "s" };
    format!("{n} {what}{}", if n == 1 { "" } else { plural })
}

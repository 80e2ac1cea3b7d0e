//! The canonical encoding: what exactly is hashed (`docs/AUDIT.md`, "The
//! canonical encoding", documents it, `scripts/verify-audit-export`
//! implements it in plain Python).
//!
//! Every value is text (UTF-8): integers in decimal, times as RFC 3339 UTC
//! with six fractional digits (`2026-11-29T10:00:00.000000Z`), booleans as
//! `true` / `false`. A value is encoded as its byte length (4 bytes, big
//! endian) followed by its bytes; an absent value (SQL NULL) as the four
//! bytes `ff ff ff ff`. So no two sequences of values share an encoding.
//!
//! - a row's hash: SHA-256 over its 9 values in the order of [`ROW_FIELDS`];
//! - a seal's digest: SHA-256 over the value [`SEAL_DOMAIN`], the seal's 10
//!   values in the order of [`SEAL_FIELDS`] (its previous digest is the
//!   last), then the 32-byte hashes of its rows in `(id, at)` order.
//!
//! Digests are written as 64 lowercase hex characters; the first seal's
//! previous digest is 64 zeros. A seal also keeps the first 4 bytes of each
//! row's hash (`row_tags`), so that verification can name the row that no
//! longer matches; they are not part of the digest.

use crate::store::shared::IdRanges;
use crate::store::{AuditRecord, AuditSeal};
use crate::time_fmt::rfc3339;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

/// The first value of every seal's digest input.
pub const SEAL_DOMAIN: &str = "oncegate audit seal v1";

/// A row's values, in hashing order.
pub const ROW_FIELDS: [&str; 9] = [
    "id",
    "at",
    "decision",
    "tier",
    "key_prefix",
    "award_id",
    "instance",
    "payload_changed",
    "detail",
];

/// A seal's values, in hashing order (after [`SEAL_DOMAIN`]).
pub const SEAL_FIELDS: [&str; 10] = [
    "seq",
    "first_id",
    "last_id",
    "row_count",
    "absent_ids",
    "min_at",
    "max_at",
    "sealed_at",
    "sealed_by",
    "prev_digest",
];

/// Appends one value: length-prefixed bytes, or the absent marker.
fn put(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(v) => {
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        None => out.extend_from_slice(&[0xff; 4]),
    }
}

/// A row as text, exactly as hashed (from the store or from an export line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowText {
    pub id: i64,
    /// The values of [`ROW_FIELDS`], in order (`values[0]` is the id).
    pub values: Vec<Option<String>>,
}

impl RowText {
    /// The row's hash.
    pub fn hash(&self) -> [u8; 32] {
        let mut bytes = Vec::with_capacity(160);
        for v in &self.values {
            put(&mut bytes, v.as_deref());
        }
        Sha256::digest(&bytes).into()
    }
}

impl From<&AuditRecord> for RowText {
    fn from(r: &AuditRecord) -> Self {
        Self {
            id: r.id,
            values: vec![
                Some(r.id.to_string()),
                Some(rfc3339(r.at)),
                Some(r.decision.clone()),
                r.tier.clone(),
                Some(r.key_prefix.clone()),
                Some(r.award_id.clone()),
                Some(r.instance.clone()),
                Some(r.payload_changed.to_string()),
                r.detail.clone(),
            ],
        }
    }
}

/// A seal as text, exactly as hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealText {
    pub seq: i64,
    pub first_id: i64,
    pub last_id: i64,
    pub row_count: i64,
    pub absent_ids: String,
    pub min_at: String,
    pub max_at: String,
    pub sealed_at: String,
    pub sealed_by: String,
    pub prev_digest: String,
    pub digest: String,
    pub row_tags: Vec<u8>,
    /// Not hashed: the signature over the digest, and its key id.
    pub signature: Option<String>,
    pub key_id: Option<String>,
}

impl SealText {
    /// The digest of this seal over `hashes` (its rows' hashes, in order).
    pub fn digest_over(&self, hashes: &[[u8; 32]]) -> String {
        let mut head = Vec::with_capacity(320);
        put(&mut head, Some(SEAL_DOMAIN));
        for v in [
            self.seq.to_string(),
            self.first_id.to_string(),
            self.last_id.to_string(),
            self.row_count.to_string(),
        ] {
            put(&mut head, Some(&v));
        }
        for v in [
            &self.absent_ids,
            &self.min_at,
            &self.max_at,
            &self.sealed_at,
            &self.sealed_by,
            &self.prev_digest,
        ] {
            put(&mut head, Some(v));
        }
        let mut h = Sha256::new();
        h.update(&head);
        for row in hashes {
            h.update(row);
        }
        hex::encode(h.finalize())
    }
}

impl From<&AuditSeal> for SealText {
    fn from(s: &AuditSeal) -> Self {
        Self {
            seq: s.seq,
            first_id: s.first_id,
            last_id: s.last_id,
            row_count: s.row_count,
            absent_ids: s.absent_ids.clone(),
            min_at: rfc3339(s.min_at),
            max_at: rfc3339(s.max_at),
            sealed_at: rfc3339(s.sealed_at),
            sealed_by: s.sealed_by.clone(),
            prev_digest: s.prev_digest.clone(),
            digest: s.digest.clone(),
            row_tags: s.row_tags.clone(),
            signature: s.signature.clone(),
            key_id: s.key_id.clone(),
        }
    }
}

/// Where the chain stands: the newest seal's number, last id and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: i64,
    pub last_id: i64,
    pub digest: String,
}

impl Head {
    /// Before the first seal.
    pub fn genesis() -> Self {
        Self {
            seq: 0,
            last_id: 0,
            digest: crate::store::shared::GENESIS_DIGEST.to_string(),
        }
    }
}

impl From<&AuditSeal> for Head {
    fn from(s: &AuditSeal) -> Self {
        Self {
            seq: s.seq,
            last_id: s.last_id,
            digest: s.digest.clone(),
        }
    }
}

/// A seal in the making: rows are added in id order.
#[derive(Debug)]
pub struct SealBuilder {
    first_id: i64,
    next_id: i64,
    absent: IdRanges,
    hashes: Vec<[u8; 32]>,
    times: Option<(OffsetDateTime, OffsetDateTime)>,
}

impl SealBuilder {
    /// A seal following `head`.
    pub fn after(head: &Head) -> Self {
        Self {
            first_id: head.last_id + 1,
            next_id: head.last_id + 1,
            absent: IdRanges::default(),
            hashes: Vec::new(),
            times: None,
        }
    }

    /// Adds the next row; an error when its id is not above the last one
    /// (two rows with one id: someone wrote one by hand).
    pub fn push(&mut self, row: &AuditRecord) -> Result<(), String> {
        if row.id < self.next_id {
            return Err(format!(
                "audit_log holds a row with id {} at or below an id already sealed or read ({}): \
                 a row written by hand; refusing to seal it",
                row.id,
                self.next_id - 1
            ));
        }
        self.absent.push_range(self.next_id, row.id - 1);
        self.next_id = row.id + 1;
        self.hashes.push(RowText::from(row).hash());
        self.times = Some(match self.times {
            None => (row.at, row.at),
            Some((lo, hi)) => (lo.min(row.at), hi.max(row.at)),
        });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The seal numbered after `head`, covering ids up to `last_id` (at
    /// least the last row added). `None` without rows.
    pub fn finish(mut self, head: &Head, last_id: i64, sealed_by: &str) -> Option<AuditSeal> {
        let (min_at, max_at) = self.times?;
        let last_id = last_id.max(self.next_id - 1);
        self.absent.push_range(self.next_id, last_id);
        let mut seal = AuditSeal {
            seq: head.seq + 1,
            first_id: self.first_id,
            last_id,
            row_count: self.hashes.len() as i64,
            absent_ids: self.absent.to_string(),
            min_at,
            max_at,
            sealed_at: crate::time_fmt::now_micros(),
            sealed_by: sealed_by.to_string(),
            prev_digest: head.digest.clone(),
            digest: String::new(),
            row_tags: self.hashes.iter().flat_map(|h| h[..4].to_vec()).collect(),
            signature: None,
            key_id: None,
        };
        seal.digest = SealText::from(&seal).digest_over(&self.hashes);
        Some(seal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, award: &str) -> AuditRecord {
        AuditRecord {
            id,
            at: crate::time_fmt::from_micros(1_764_410_400_000_001),
            decision: "duplicate".into(),
            tier: Some("LOCAL_CACHE".into()),
            key_prefix: "0123456789ab".into(),
            award_id: award.into(),
            instance: "pod-a".into(),
            payload_changed: false,
            detail: None,
        }
    }

    #[test]
    fn the_encoding_is_length_prefixed_with_a_marker_for_null() {
        let mut out = Vec::new();
        put(&mut out, Some("ab"));
        put(&mut out, None);
        put(&mut out, Some(""));
        assert_eq!(out, [0, 0, 0, 2, b'a', b'b', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let text = RowText::from(&row(7, "AWD-1"));
        assert_eq!(text.values[1].as_deref(), Some("2025-11-29T10:00:00.000001Z"));
        assert_eq!(text.values[7].as_deref(), Some("false"));
    }

    /// Pinned: the digest `scripts/verify-audit-export`'s `digest()` gives
    /// for this seal and these rows, so a change of the encoding cannot go
    /// unnoticed (the export tests run the script on real exports too).
    #[test]
    fn a_seal_digest_is_pinned() {
        let mut b = SealBuilder::after(&Head::genesis());
        b.push(&row(1, "AWD-1")).unwrap();
        b.push(&row(3, "AWD-2")).unwrap();
        let mut seal = b.finish(&Head::genesis(), 4, "pod-a").unwrap();
        assert_eq!((seal.first_id, seal.last_id, seal.row_count), (1, 4, 2));
        assert_eq!(seal.absent_ids, "2,4");
        seal.sealed_at = crate::time_fmt::from_micros(1_764_410_460_000_000);
        let hashes = [
            RowText::from(&row(1, "AWD-1")).hash(),
            RowText::from(&row(3, "AWD-2")).hash(),
        ];
        assert_eq!(
            SealText::from(&seal).digest_over(&hashes),
            "141426cca61883a639fc6ba8d950b9a74b0b83e129beab0f95f1ae420ae63913"
        );
    }

    #[test]
    fn a_second_row_with_a_sealed_id_is_refused() {
        let mut b = SealBuilder::after(&Head::genesis());
        b.push(&row(5, "A")).unwrap();
        assert!(b.push(&row(5, "B")).unwrap_err().contains("id 5"));
    }
}

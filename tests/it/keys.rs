//! Key derivation against the shared vectors (`clients/vectors/keys.json`),
//! computed independently by Python's hashlib (`clients/vectors/make_vectors.py`)
//! and read by every client's tests too.

use crate::helpers::oncegate_bin;
use crate::vectors::{KeyVector, key_vectors};
use oncegate::key::{derive_key, payload_digest};
use oncegate::submission::{Limits, Submission};

#[test]
fn keys_match_the_python_reference_vectors() {
    let vectors = key_vectors();
    assert!(vectors.len() >= 90, "{} key vectors", vectors.len());
    for v in vectors {
        let payload = v.payload();
        assert_eq!(payload_digest(&payload), v.payload_sha256, "{}", v.name);
        let key = derive_key(&v.award_id, &v.submission_timestamp, &payload);
        assert_eq!(key, v.derived_key, "{}", v.name);
        assert_eq!(key.len(), 64);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
}

#[test]
fn every_key_vector_is_a_valid_submission_with_its_key() {
    for v in key_vectors() {
        let valid = Submission::validate(&v.submission(), Limits::default())
            .unwrap_or_else(|e| panic!("{}: refused: {e}", v.name));
        assert_eq!(valid.key, v.key, "{}", v.name);
        assert_eq!(valid.payload_digest, v.payload_sha256, "{}", v.name);
    }
}

#[test]
fn one_changed_payload_byte_changes_every_vector_key() {
    for v in key_vectors() {
        let mut payload = v.payload();
        if payload.is_empty() {
            payload.push(0);
        } else {
            payload[0] ^= 1;
        }
        assert_ne!(
            derive_key(&v.award_id, &v.submission_timestamp, &payload),
            v.derived_key
        );
    }
}

#[test]
fn the_key_subcommand_prints_the_same_keys() {
    use std::io::Write;
    // The CLI reads one JSON line per submission: the small payloads only.
    let vectors: Vec<KeyVector> = key_vectors()
        .into_iter()
        .filter(|v| v.payload_repeat == 1)
        .collect();
    let mut child = std::process::Command::new(oncegate_bin())
        .args(["key", "--jsonl"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for v in &vectors {
            let line = serde_json::json!({"award_id": v.award_id, "submission_timestamp": v.submission_timestamp, "payload_b64": v.payload_b64});
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let printed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let expected: Vec<String> = vectors.into_iter().map(|v| v.derived_key).collect();
    assert_eq!(printed, expected);
}

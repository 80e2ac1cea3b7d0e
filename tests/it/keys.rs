//! Key derivation against vectors computed independently by Python's
//! hashlib (`tests/vectors/make_key_vectors.py` wrote `keys.json`).

use base64::Engine;
use oncegate::key::derive_key;

#[derive(serde::Deserialize)]
struct Vector {
    award_id: String,
    submission_timestamp: String,
    payload_b64: String,
    key: String,
}

fn vectors() -> Vec<Vector> {
    serde_json::from_str(include_str!("../vectors/keys.json")).expect("valid vectors file")
}

#[test]
fn keys_match_the_python_reference_vectors() {
    let vectors = vectors();
    assert!(vectors.len() >= 60);
    for v in vectors {
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&v.payload_b64)
            .unwrap();
        let key = derive_key(&v.award_id, &v.submission_timestamp, &payload);
        assert_eq!(
            key, v.key,
            "award {:?} ts {:?}",
            v.award_id, v.submission_timestamp
        );
        assert_eq!(key.len(), 64);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
}

#[test]
fn one_changed_payload_byte_changes_every_vector_key() {
    for v in vectors() {
        let mut payload = base64::engine::general_purpose::STANDARD
            .decode(&v.payload_b64)
            .unwrap();
        if payload.is_empty() {
            payload.push(0);
        } else {
            payload[0] ^= 1;
        }
        assert_ne!(derive_key(&v.award_id, &v.submission_timestamp, &payload), v.key);
    }
}

#[test]
fn the_key_subcommand_prints_the_same_keys() {
    use std::io::Write;
    let vectors = vectors();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
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
    let expected: Vec<String> = vectors.into_iter().map(|v| v.key).collect();
    assert_eq!(printed, expected);
}

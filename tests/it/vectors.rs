//! The shared vectors under `clients/vectors/`, which every client's tests read
//! too (Rust, Python, Java, Go, TypeScript), held against the server itself:
//! each key vector is a submission the server accepts with that key, each
//! rejection is what the server answers over gRPC (code and exact message),
//! and `refused_chars.json` is the server's own table of the characters an
//! award id may not contain. `ONCEGATE_WRITE_VECTORS=1` rewrites that table
//! (after a Unicode update of the server's tables); the other two files are
//! written by `clients/vectors/make_vectors.py`.

use crate::helpers::{Kind, TestApp, TestDb, serve_args};
use base64::Engine;
use oncegate::pb::{self, effects_client::EffectsClient};
use oncegate::submission::{Limits, Submission};
use serde_json::Value;
use tonic::transport::Channel;

const KEYS: &str = include_str!("../../clients/vectors/keys.json");
const REJECTIONS: &str = include_str!("../../clients/vectors/rejections.json");
const REFUSED_CHARS: &str = include_str!("../../clients/vectors/refused_chars.json");

/// One entry of `keys.json`: a valid submission and its key.
#[derive(serde::Deserialize)]
pub struct KeyVector {
    pub name: String,
    pub award_id: String,
    pub submission_timestamp: String,
    pub payload_b64: String,
    #[serde(default = "one")]
    pub payload_repeat: usize,
    amount_cents: String,
    idempotency_key: Option<String>,
    pub payload_sha256: String,
    /// The key derived from award id, timestamp and payload.
    pub derived_key: String,
    /// The submission's key: the producer's when it has one, else derived.
    pub key: String,
}

fn one() -> usize {
    1
}

impl KeyVector {
    pub fn payload(&self) -> Vec<u8> {
        decode(&self.payload_b64).repeat(self.payload_repeat)
    }

    pub fn submission(&self) -> pb::Submission {
        pb::Submission {
            award_id: self.award_id.clone(),
            submission_timestamp: self.submission_timestamp.clone(),
            payload: self.payload(),
            amount_cents: self.amount_cents.parse().expect("amount_cents is an int64"),
            idempotency_key: self.idempotency_key.clone(),
        }
    }
}

pub fn key_vectors() -> Vec<KeyVector> {
    #[derive(serde::Deserialize)]
    struct File {
        keys: Vec<KeyVector>,
    }
    serde_json::from_str::<File>(KEYS).expect("valid keys.json").keys
}

/// One entry of `rejections.json`.
#[derive(serde::Deserialize)]
struct Rejection {
    name: String,
    rpc: String,
    request: Value,
    code: String,
    message: String,
    max_payload_bytes: Option<usize>,
}

fn rejections() -> Vec<Rejection> {
    #[derive(serde::Deserialize)]
    struct File {
        rejections: Vec<Rejection>,
    }
    serde_json::from_str::<File>(REJECTIONS)
        .expect("valid rejections.json")
        .rejections
}

fn decode(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64")
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}

/// `{field}_b64` repeated `{field}_repeat` times.
fn body(v: &Value, field: &str) -> Vec<u8> {
    let repeat = v[format!("{field}_repeat")].as_u64().unwrap_or(1) as usize;
    decode(v[format!("{field}_b64")].as_str().unwrap_or_default()).repeat(repeat)
}

fn submission(v: &Value) -> pb::Submission {
    pb::Submission {
        award_id: text(v, "award_id"),
        submission_timestamp: text(v, "submission_timestamp"),
        payload: body(v, "payload"),
        amount_cents: text(v, "amount_cents").parse().expect("int64"),
        idempotency_key: v["idempotency_key"].as_str().map(str::to_string),
    }
}

fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        _ => "UNEXPECTED",
    }
}

#[test]
fn submit_rejections_are_the_validations_answers() {
    let mut checked = 0;
    for r in rejections().iter().filter(|r| r.rpc == "Submit") {
        let limits = Limits {
            max_payload_bytes: r.max_payload_bytes.unwrap_or(Limits::default().max_payload_bytes),
        };
        let err = Submission::validate(&submission(&r.request), limits)
            .err()
            .unwrap_or_else(|| panic!("{}: accepted", r.name));
        assert_eq!(
            (code_name(err.code()), err.to_string().as_str()),
            (r.code.as_str(), r.message.as_str()),
            "{}",
            r.name
        );
        checked += 1;
    }
    assert!(checked >= 80, "{checked} Submit rejections");
}

/// What the server answers to one rejection vector, over gRPC.
async fn answer(app: &TestApp, r: &Rejection) -> Result<(), tonic::Status> {
    let v = &r.request;
    let mut gate = app.client().await;
    let mut effects = EffectsClient::<Channel>::connect(format!("http://{}", app.addr))
        .await
        .expect("connect")
        .max_decoding_message_size(usize::MAX);
    let fenced = |f: &str| -> String { text(v, f) };
    match r.rpc.as_str() {
        "Submit" => gate.submit(submission(v)).await.map(drop),
        "Lookup" => gate
            .lookup(pb::LookupRequest {
                idempotency_key: text(v, "idempotency_key"),
            })
            .await
            .map(drop),
        "SubmitBatch" => {
            let count = v["count"].as_u64().expect("count") as usize;
            let submissions = vec![submission(&v["submission"]); count];
            gate.submit_batch(pb::SubmitBatchRequest { submissions })
                .await
                .map(drop)
        }
        "Begin" => effects.begin(begin_request(v)).await.map(drop),
        "Complete" => effects
            .complete(pb::CompleteRequest {
                namespace: fenced("namespace"),
                idempotency_key: fenced("idempotency_key"),
                lease_token: fenced("lease_token"),
                response: body(v, "response"),
            })
            .await
            .map(drop),
        "Release" => effects
            .release(pb::ReleaseRequest {
                namespace: fenced("namespace"),
                idempotency_key: fenced("idempotency_key"),
                lease_token: fenced("lease_token"),
                reason: fenced("reason"),
            })
            .await
            .map(drop),
        other => panic!("{}: unknown rpc {other}", r.name),
    }
}

fn begin_request(v: &Value) -> pb::BeginRequest {
    pb::BeginRequest {
        namespace: text(v, "namespace"),
        idempotency_key: text(v, "idempotency_key"),
        request: body(v, "request"),
        lease_ttl: v.get("lease_ttl").map(|t| prost_types::Duration {
            seconds: text(t, "seconds").parse().expect("int64 seconds"),
            nanos: t["nanos"].as_i64().expect("nanos") as i32,
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_every_rejection_vector_and_claims_every_key_vector() {
    let db = TestDb::new(Kind::Sqlite).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let rejections = rejections();
    assert!(rejections.len() >= 120, "{} rejections", rejections.len());
    for r in &rejections {
        let status = answer(&app, r)
            .await
            .err()
            .unwrap_or_else(|| panic!("{} ({}): accepted", r.name, r.rpc));
        assert_eq!(
            (code_name(status.code()), status.message()),
            (r.code.as_str(), r.message.as_str()),
            "{} ({})",
            r.name,
            r.rpc
        );
    }
    assert_eq!(db.counts().await.disbursements, 0, "a rejection wrote");
    let mut gate = app.client().await;
    for v in key_vectors() {
        let d = gate
            .submit(v.submission())
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", v.name))
            .into_inner();
        assert_eq!(d.outcome, pb::Outcome::Claimed as i32, "{}", v.name);
        assert_eq!(d.idempotency_key, v.key, "{}", v.name);
    }
    app.shutdown().await;
}

/// `refused_chars.json` as the server's tables make it.
fn refused_chars_file() -> String {
    let (major, minor, patch) = oncegate::submission::UNICODE_VERSION;
    let refused = ranges(|cp| match char::from_u32(cp) {
        Some(c) => oncegate::submission::refused_char(c),
        None => Some("unassigned character"), // surrogates
    });
    let white = ranges(|cp| char::from_u32(cp).filter(|c| c.is_whitespace()).map(|_| ""));
    let line = |(lo, hi, what): &(u32, u32, &str)| -> String {
        if what.is_empty() {
            format!("  [\"{lo:04X}\", \"{hi:04X}\"]")
        } else {
            format!("  [\"{lo:04X}\", \"{hi:04X}\", \"{what}\"]")
        }
    };
    let join = |rs: &[(u32, u32, &str)]| rs.iter().map(line).collect::<Vec<_>>().join(",\n");
    format!(
        "{{\n \"about\": \"The characters an award id may not contain (the server's general categories, Unicode {major}.{minor}.{patch}): inclusive code point ranges [first, last, the name the error message gives], surrogates included (the server names them unassigned). white_space: the characters an award id may not begin or end with (Unicode White_Space). Written by the Rust test vectors::refused_chars_table_is_the_servers (ONCEGATE_WRITE_VECTORS=1).\",\n \"unicode_version\": \"{major}.{minor}.{patch}\",\n \"refused\": [\n{}\n ],\n \"white_space\": [\n{}\n ]\n}}\n",
        join(&refused),
        join(&white)
    )
}

/// Maximal runs of code points with the same `Some` answer.
fn ranges(of: impl Fn(u32) -> Option<&'static str>) -> Vec<(u32, u32, &'static str)> {
    let mut out: Vec<(u32, u32, &'static str)> = Vec::new();
    for cp in 0..=0x10FFFF_u32 {
        match (of(cp), out.last_mut()) {
            (Some(what), Some(last)) if last.1 + 1 == cp && last.2 == what => last.1 = cp,
            (Some(what), _) => out.push((cp, cp, what)),
            (None, _) => {}
        }
    }
    out
}

#[test]
fn refused_chars_table_is_the_servers() {
    let expected = refused_chars_file();
    if std::env::var_os("ONCEGATE_WRITE_VECTORS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/vectors/refused_chars.json");
        std::fs::write(path, &expected).expect("write refused_chars.json");
        return;
    }
    assert!(
        REFUSED_CHARS == expected,
        "clients/vectors/refused_chars.json is not the server's table: rewrite it with \
         ONCEGATE_WRITE_VECTORS=1 cargo test refused_chars_table"
    );
}

//! Hostile input and limits: fuzzed submissions (proptest, under plain
//! `cargo test`), malformed gRPC/HTTP/2 frames and oversized messages sent
//! by hand, then the in-flight limit, caller deadlines and pool timeouts.
//! Every failure is an error status, never a crash, never a write.

use crate::helpers::*;
use bytes::{BufMut, Bytes, BytesMut};
use oncegate::error::GateError;
use oncegate::pb::{self, Outcome, Tier};
use oncegate::submission::{Limits, Submission};
use proptest::prelude::*;
use prost::Message;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

const FIELDS: [&str; 5] = [
    "award_id",
    "submission_timestamp",
    "amount_cents",
    "payload",
    "idempotency_key",
];

/// The reference of DESIGN §1, written out independently of `oncegate::key`.
fn reference_key(award: &str, ts: &str, payload: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(payload));
    hex::encode(Sha256::digest(format!("{award}|{ts}|{digest}").as_bytes()))
}

fn timestamp() -> impl Strategy<Value = String> {
    let valid = (
        1970u32..2100,
        1u32..13,
        1u32..29,
        0u32..24,
        0u32..60,
        0u32..60,
        prop_oneof![
            Just("Z".to_string()),
            Just("+00:00".to_string()),
            Just("-05:30".to_string()),
            Just(".123456Z".to_string())
        ],
    )
        .prop_map(|(y, mo, d, h, mi, s, tail)| format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{tail}"));
    prop_oneof![4 => valid, 1 => any::<String>(), 1 => "20[0-9]{2}-[0-9]{2}-[0-9]{2}[Tt ].{0,12}"]
}

/// RFC 3339 §5.6 `date-time` by its grammar, written apart from the
/// validator (a template walk, a month table): the oracle of the
/// timestamp properties below.
fn rfc3339_oracle(ts: &str) -> bool {
    const TEMPLATE: &str = "0000-00-00T00:00:00";
    if !ts.is_ascii() || ts.len() < TEMPLATE.len() {
        return false;
    }
    let (head, tail) = ts.split_at(TEMPLATE.len());
    let shape = head.chars().zip(TEMPLATE.chars()).all(|(c, t)| match t {
        '0' => c.is_ascii_digit(),
        'T' => c == 'T' || c == 't',
        other => c == other,
    });
    if !shape {
        return false;
    }
    let n = |from: usize, to: usize| head[from..to].parse::<u32>().unwrap();
    let (year, month, day) = (n(0, 4), n(5, 7), n(8, 10));
    let (hour, minute, second) = (n(11, 13), n(14, 16), n(17, 19));
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let calendar =
        (1..=12).contains(&month) && day >= 1 && day <= month_days[(month as usize).clamp(1, 12) - 1];
    let clock = hour < 24 && minute < 60 && (second < 60 || (second == 60 && minute == 59));
    let tail = match tail.strip_prefix('.') {
        Some(frac) => {
            let digits = frac.len() - frac.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                return false;
            }
            &frac[digits..]
        }
        None => tail,
    };
    let offset = tail == "Z"
        || tail == "z"
        || (tail.len() == 6
            && (tail.starts_with('+') || tail.starts_with('-'))
            && &tail[3..4] == ":"
            && tail[1..3]
                .chars()
                .chain(tail[4..6].chars())
                .all(|c| c.is_ascii_digit())
            && tail[1..3].parse::<u32>().unwrap() < 24
            && tail[4..6].parse::<u32>().unwrap() < 60);
    calendar && clock && offset
}

/// Timestamps one character away from valid ones (the separators, control
/// characters, digits that break the calendar), and anything at all.
fn near_timestamp() -> impl Strategy<Value = String> {
    let replacement = prop_oneof![
        Just('T'),
        Just('t'),
        Just(' '),
        Just('x'),
        Just('\0'),
        Just('\n'),
        Just('\u{7f}'),
        Just(':'),
        Just('-'),
        Just('.'),
        Just('+'),
        Just('Z'),
        Just('z'),
        Just('é'),
        Just('\u{200b}'),
        proptest::char::range('0', '9'),
    ];
    let mutated = (
        timestamp(),
        any::<prop::sample::Index>(),
        replacement,
        any::<bool>(),
    )
        .prop_map(|(ts, at, c, insert)| {
            let mut chars: Vec<char> = ts.chars().collect();
            let i = at.index(chars.len() + 1);
            if insert || i == chars.len() {
                chars.insert(i.min(chars.len()), c);
            } else {
                chars[i] = c;
            }
            chars.into_iter().collect()
        });
    prop_oneof![3 => mutated, 2 => timestamp()]
}

fn raw_submission() -> impl Strategy<Value = pb::Submission> {
    (
        prop_oneof![4 => "[A-Z][A-Z0-9-]{0,20}", 1 => any::<String>(), 1 => ".{120,140}", 1 => "[a-z|]{1,5}"],
        timestamp(),
        proptest::collection::vec(any::<u8>(), 0..300),
        prop_oneof![4 => 1i64..10_000_000, 1 => any::<i64>()],
        prop_oneof![
            4 => Just(None),
            1 => "[A-Za-z0-9_.:-]{1,128}".prop_map(Some),
            1 => any::<String>().prop_map(Some)
        ],
    )
        .prop_map(|(award_id, ts, payload, amount, key)| pb::Submission {
            award_id,
            submission_timestamp: ts,
            payload,
            amount_cents: amount,
            idempotency_key: key,
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 3000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(crate::helpers::test_seed()),
        ..ProptestConfig::default()
    })]

    /// Validation never panics; a valid submission's derived key is the
    /// reference, 64 lowercase hex and deterministic; an invalid one is
    /// `INVALID_ARGUMENT` (or `RESOURCE_EXHAUSTED` for size) naming a field.
    #[test]
    fn fuzzed_submissions_validate_or_name_a_field(raw in raw_submission()) {
        let limits = Limits { max_payload_bytes: 200 };
        match Submission::validate(&raw, limits) {
            Ok(s) => {
                match &raw.idempotency_key {
                    None => {
                        prop_assert_eq!(&s.key, &reference_key(&raw.award_id, &raw.submission_timestamp, &raw.payload));
                        prop_assert_eq!(s.key.len(), 64);
                        prop_assert!(s.key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
                    }
                    Some(k) => prop_assert_eq!(&s.key, k),
                }
                let again = Submission::validate(&raw, limits).unwrap();
                prop_assert_eq!(&again.key, &s.key);
                prop_assert_eq!(&again.fingerprint, &s.fingerprint);
                prop_assert!(raw.amount_cents > 0 && raw.payload.len() <= 200);
                prop_assert!(!raw.award_id.is_empty() && !raw.award_id.contains('|'));
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(FIELDS.iter().any(|f| msg.contains(f)), "{msg:?} names no field");
                let expected = if matches!(e, GateError::TooLarge(_)) { Code::ResourceExhausted } else { Code::InvalidArgument };
                prop_assert_eq!(e.code(), expected);
                if matches!(e, GateError::TooLarge(_)) {
                    prop_assert!(msg.contains("payload"));
                }
            }
        }
    }

    /// Well-formed submissions are always accepted: validation never refuses
    /// what DESIGN §1 allows.
    #[test]
    fn well_formed_submissions_are_accepted(
        award in "[A-Za-z0-9]([A-Za-z0-9 ._/-]{0,126}[A-Za-z0-9._/-])?",
        ts in timestamp().prop_filter("valid", |t| rfc3339_oracle(t)),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        amount in 1i64..=i64::MAX,
    ) {
        let raw = submission(&award, &ts, &payload, amount);
        let s = Submission::validate(&raw, Limits::default());
        prop_assert!(s.is_ok(), "{:?}", s.err());
        prop_assert_eq!(s.unwrap().key, oncegate::key::derive_key(&award, &ts, &payload));
    }

    /// A timestamp is accepted exactly when the independent grammar says it
    /// is an RFC 3339 date-time.
    #[test]
    fn timestamps_are_accepted_exactly_by_the_rfc3339_grammar(ts in near_timestamp()) {
        let raw = submission("AWD-TS", &ts, b"{}", 1);
        let accepted = Submission::validate(&raw, Limits::default());
        prop_assert_eq!(accepted.is_ok(), rfc3339_oracle(&ts), "{:?}: {:?}", ts, accepted.err());
    }

    /// One changed payload byte, award character or timestamp character
    /// gives another key.
    #[test]
    fn any_change_to_the_identity_changes_the_key(
        award in "[A-Z0-9-]{1,20}",
        payload in proptest::collection::vec(any::<u8>(), 1..200),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let ts = "2026-11-29T10:00:00Z";
        let key = oncegate::key::derive_key(&award, ts, &payload);
        let mut changed = payload.clone();
        let i = at.index(changed.len());
        changed[i] ^= flip;
        prop_assert_ne!(&key, &oncegate::key::derive_key(&award, ts, &changed));
        prop_assert_ne!(&key, &oncegate::key::derive_key(&format!("{award}X"), ts, &payload));
        prop_assert_ne!(&key, &oncegate::key::derive_key(&award, "2026-11-29T10:00:00+00:00", &payload));
    }
}

// ---- malformed frames -------------------------------------------------------

/// What came back for one hand-built request.
#[derive(Debug)]
struct RawReply {
    http: Option<u16>,
    grpc_status: Option<i32>,
    message: String,
    reset: Option<String>,
}

impl RawReply {
    fn is_error(&self) -> bool {
        self.reset.is_some()
            || self.grpc_status.is_some_and(|c| c != 0)
            || self.http.is_some_and(|h| h != 200)
    }
}

/// One HTTP/2 request with exactly `body` as its DATA (no framing added).
async fn raw_call(addr: SocketAddr, path: &str, content_type: &str, body: Bytes) -> RawReply {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(req, false).unwrap();
    let _ = send.send_data(body, true);
    let mut reply = RawReply {
        http: None,
        grpc_status: None,
        message: String::new(),
        reset: None,
    };
    let read = async {
        let response = match response.await {
            Ok(r) => r,
            Err(e) => {
                reply.reset = Some(e.to_string());
                return;
            }
        };
        reply.http = Some(response.status().as_u16());
        let (parts, mut body) = response.into_parts();
        let mut status_from = |h: &http::HeaderMap| {
            if let Some(s) = h.get("grpc-status") {
                reply.grpc_status = s.to_str().ok().and_then(|s| s.parse().ok());
                reply.message = h
                    .get("grpc-message")
                    .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
                    .unwrap_or_default();
            }
        };
        status_from(&parts.headers);
        while let Some(chunk) = body.data().await {
            match chunk {
                Ok(c) => {
                    let _ = body.flow_control().release_capacity(c.len());
                }
                Err(e) => {
                    reply.reset = Some(e.to_string());
                    return;
                }
            }
        }
        if let Ok(Some(t)) = body.trailers().await {
            status_from(&t);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server answers a malformed request");
    reply
}

fn grpc_frame(flag: u8, declared_len: u32, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + body.len());
    b.put_u8(flag);
    b.put_u32(declared_len);
    b.put_slice(body);
    b.freeze()
}

fn encoded(s: &pb::Submission) -> Vec<u8> {
    s.encode_to_vec()
}

fn hostile_args(db: &TestDb) -> oncegate::config::ServeArgs {
    let mut args = serve_args(db);
    args.max_message_bytes = 64 * 1024;
    args.max_payload_bytes = 16 * 1024;
    args.max_batch_items = 10;
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_frames_are_errors_and_write_nothing() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(hostile_args(&db)).await;
    let valid = encoded(&submission("AWD-H", "2026-11-29T10:00:00Z", b"{}", 100));
    let huge = encoded(&submission(
        "AWD-H",
        "2026-11-29T10:00:00Z",
        &vec![b'x'; 200 * 1024],
        100,
    ));
    // A string field holding invalid UTF-8: field 1 (award_id), length 2.
    let bad_utf8 = [0x0a, 0x02, 0xff, 0xfe];
    // Field 1 declared 100 bytes long, 3 present.
    let truncated_field = [0x0a, 100, b'a', b'b', b'c'];
    let garbage: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let submit = "/oncegate.v1.Gate/Submit";
    let cases: Vec<(&str, &str, &str, Bytes)> = vec![
        (
            "garbage protobuf",
            submit,
            "application/grpc",
            grpc_frame(0, garbage.len() as u32, &garbage),
        ),
        (
            "invalid utf-8 in a string field",
            submit,
            "application/grpc",
            grpc_frame(0, 4, &bad_utf8),
        ),
        (
            "field longer than the message",
            submit,
            "application/grpc",
            grpc_frame(0, 5, &truncated_field),
        ),
        (
            "length prefix larger than the body",
            submit,
            "application/grpc",
            grpc_frame(0, 4096, &valid),
        ),
        (
            "length prefix of 4 GiB",
            submit,
            "application/grpc",
            grpc_frame(0, u32::MAX, &valid),
        ),
        (
            "truncated frame header",
            submit,
            "application/grpc",
            Bytes::from_static(&[0, 0, 0]),
        ),
        (
            "compressed flag without grpc-encoding",
            submit,
            "application/grpc",
            grpc_frame(1, valid.len() as u32, &valid),
        ),
        (
            "unknown flag",
            submit,
            "application/grpc",
            grpc_frame(7, valid.len() as u32, &valid),
        ),
        ("no message at all", submit, "application/grpc", Bytes::new()),
        (
            "message over ONCEGATE_MAX_MESSAGE_BYTES",
            submit,
            "application/grpc",
            grpc_frame(0, huge.len() as u32, &huge),
        ),
        (
            "garbage batch",
            "/oncegate.v1.Gate/SubmitBatch",
            "application/grpc",
            grpc_frame(0, garbage.len() as u32, &garbage),
        ),
        (
            "garbage lookup",
            "/oncegate.v1.Gate/Lookup",
            "application/grpc",
            grpc_frame(0, garbage.len() as u32, &garbage),
        ),
        (
            "unknown method",
            "/oncegate.v1.Gate/Drop",
            "application/grpc",
            grpc_frame(0, valid.len() as u32, &valid),
        ),
        ("not gRPC", submit, "text/plain", Bytes::from_static(b"hello")),
    ];
    for (what, path, content_type, body) in cases {
        let reply = raw_call(app.addr, path, content_type, body).await;
        println!("{what}: {reply:?}");
        assert!(reply.is_error(), "{what} must be an error: {reply:?}");
        assert_eq!(db.counts().await, Counts::default(), "{what} wrote something");
    }

    // The oversized message through an ordinary client: a size error.
    let mut c = app.client().await;
    let err = c
        .submit(submission(
            "AWD-H",
            "2026-11-29T10:00:00Z",
            &vec![b'x'; 200 * 1024],
            100,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "oversized message: {err:?}");
    assert!(err.message().contains("too large"), "{err:?}");
    // Over the payload limit but under the message limit: named, not written.
    let err = c
        .submit(submission(
            "AWD-H",
            "2026-11-29T10:00:00Z",
            &vec![b'x'; 20 * 1024],
            100,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("payload"), "{err:?}");
    // More batch items than allowed.
    let items = (0..11)
        .map(|i| submission("AWD-H", "2026-11-29T10:00:00Z", &[i], 1))
        .collect();
    let err = c
        .submit_batch(pb::SubmitBatchRequest { submissions: items })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("submissions"), "{err:?}");
    assert_eq!(db.counts().await, Counts::default());

    // Still serving, and the first real write is the only one.
    let d = c
        .submit(submission("AWD-H", "2026-11-29T10:00:00Z", b"{}", 100))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&d), Outcome::Claimed);
    assert_eq!(db.counts().await.ledger(), (1, 1, 100, 1));
}

/// Bytes that are not HTTP/2 at all, and an HTTP/2 connection with broken
/// frames: the connection is closed, the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_socket_closes_the_connection_not_the_server() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(hostile_args(&db)).await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let frame_of_unknown_type_and_huge_length = [0xff, 0xff, 0xff, 0x99, 0, 0, 0, 0, 1];
    let headers_on_stream_zero = [0, 0, 4, 0x01, 0x05, 0, 0, 0, 0, 0x82, 0x86, 0x84, 0x41];
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        (
            "random bytes",
            (0..4096u32).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect(),
        ),
        (
            "HTTP/1.1 request",
            b"POST /oncegate.v1.Gate/Submit HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        (
            "TLS client hello",
            vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03],
        ),
        (
            "preface then a frame of unknown type and huge length",
            [preface.clone(), frame_of_unknown_type_and_huge_length.to_vec()].concat(),
        ),
        (
            "preface then HEADERS on stream 0",
            [preface.clone(), headers_on_stream_zero.to_vec()].concat(),
        ),
    ];
    for (what, bytes) in inputs {
        let mut s = TcpStream::connect(app.addr).await.unwrap();
        let _ = s.write_all(&bytes).await;
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "{what}: the server should close the connection");
    }
    let mut c = app.client().await;
    let d = c
        .submit(submission("AWD-G", "2026-11-29T10:00:00Z", b"{}", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&d), Outcome::Claimed);
    assert_eq!(db.counts().await.ledger(), (1, 1, 5, 1));
}

// ---- limits -------------------------------------------------------------------

/// Holds `processed_messages` locked against writes (every claim waits,
/// reads go on) until released.
struct ClaimLock(sqlx::PgConnection);

impl ClaimLock {
    async fn take(db: &TestDb) -> Self {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql("BEGIN; LOCK TABLE processed_messages IN EXCLUSIVE MODE")
            .execute(&mut c)
            .await
            .unwrap();
        Self(c)
    }

    async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK").execute(&mut self.0).await.unwrap();
    }
}

/// These tests keep claims waiting on a held lock for longer than the
/// default `lock_timeout` would allow (hardening.rs tests the timeout).
fn waits_on_locks(mut args: oncegate::config::ServeArgs) -> oncegate::config::ServeArgs {
    args.store.db_lock_timeout = Duration::from_secs(30);
    args.store.db_statement_timeout = Duration::from_secs(30);
    args
}

async fn claims_waiting_on_the_lock(db: &TestDb) -> bool {
    let db_name = db.name.clone();
    db.scalar(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db_name}' AND wait_event_type = 'Lock'"
    ))
    .await
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_requests_are_refused_not_queued() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut args = waits_on_locks(serve_args(&db));
    args.max_in_flight = 2;
    let app = TestApp::spawn(args).await;
    let lock = ClaimLock::take(&db).await;
    let mut held = Vec::new();
    for i in 0..2u8 {
        let mut c = app.client().await;
        held.push(tokio::spawn(async move {
            c.submit(submission("AWD-L", "2026-11-29T10:00:00Z", &[i], 10))
                .await
        }));
    }
    assert!(eventually(Duration::from_secs(10), || claims_waiting_on_the_lock(&db)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut c = app.client().await;
    let started = Instant::now();
    let err = c
        .submit(submission("AWD-L", "2026-11-29T10:00:00Z", b"third", 10))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once, not queued"
    );
    let items = vec![submission("AWD-L", "2026-11-29T10:00:00Z", b"batch", 10)];
    let err = c
        .submit_batch(pb::SubmitBatchRequest { submissions: items })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);

    lock.release().await;
    for h in held {
        assert_eq!(outcome(&h.await.unwrap().unwrap().into_inner()), Outcome::Claimed);
    }
    let d = c
        .submit(submission("AWD-L", "2026-11-29T10:00:00Z", b"third", 10))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&d), Outcome::Claimed, "admitted once there is room");
    assert_eq!(db.counts().await.ledger(), (3, 3, 30, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_deadline_is_honoured_and_the_claim_still_completes() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(waits_on_locks(serve_args(&db))).await;
    let lock = ClaimLock::take(&db).await;
    let mut c = app.client().await;
    let sub = submission("AWD-D", "2026-11-29T10:00:00Z", b"late", 77);
    let mut req = tonic::Request::new(sub.clone());
    req.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = c.submit(req).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(db.counts().await.disbursements, 0);

    // The transaction was not cut in half: it commits once the lock goes,
    // and the redelivery learns the outcome.
    lock.release().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.counts().await.disbursements == 1
        })
        .await
    );
    let d = c.submit(sub).await.unwrap().into_inner();
    assert_eq!(outcome(&d), Outcome::Duplicate);
    assert_eq!(db.counts().await.ledger(), (1, 1, 77, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_answers_unavailable_within_the_acquire_timeout() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut args = serve_args(&db);
    args.store.db_pool_size = 1;
    let app = TestApp::spawn(waits_on_locks(args)).await;
    let lock = ClaimLock::take(&db).await;
    let mut first_client = app.client().await;
    let first = tokio::spawn(async move {
        first_client
            .submit(submission(
                "AWD-P",
                "2026-11-29T10:00:00Z",
                b"holds the connection",
                1,
            ))
            .await
    });
    assert!(eventually(Duration::from_secs(10), || claims_waiting_on_the_lock(&db)).await);

    let mut c = app.client().await;
    let started = Instant::now();
    let err = c
        .submit(submission(
            "AWD-P",
            "2026-11-29T10:00:00Z",
            b"no connection left",
            2,
        ))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        waited < Duration::from_secs(8),
        "answered within the pool timeout: {waited:?}"
    );
    println!("pool exhausted: UNAVAILABLE after {waited:?}");

    lock.release().await;
    assert_eq!(
        outcome(&first.await.unwrap().unwrap().into_inner()),
        Outcome::Claimed
    );
    assert_eq!(
        db.counts().await.ledger(),
        (1, 1, 1, 1),
        "the refused one wrote nothing"
    );
}

/// A group-commit runner keeps the connection of its last batch for its
/// next only while batches follow closely: once the claims stop, every
/// connection is back in the pool within moments, and a claim after that
/// commits on one taken from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lane_gives_its_kept_connection_back_to_the_pool() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let claim = |i: u32| submission("AWD-K", "2026-11-29T10:00:00Z", &i.to_le_bytes(), 1);
    for i in 0..20 {
        let d = c.submit(claim(i)).await.unwrap().into_inner();
        assert_eq!(outcome(&d), Outcome::Claimed);
    }
    let all_idle = || async {
        let (size, idle) = app.store.pool_usage().expect("a Postgres pool");
        size > 0 && size as usize == idle
    };
    assert!(
        eventually(Duration::from_secs(5), all_idle).await,
        "a connection stayed out of the pool after the claims stopped: {:?}",
        app.store.pool_usage()
    );
    let d = c.submit(claim(20)).await.unwrap().into_inner();
    assert_eq!(outcome(&d), Outcome::Claimed);
    assert_eq!(db.counts().await.ledger(), (21, 21, 21, 21));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_cut_answers_unavailable_within_a_bound_and_cached_duplicates_after_it() {
    let db = TestDb::new(Kind::Postgres).await;
    let proxy = FaultProxy::start(pg_addr()).await;
    let mut args = serve_args(&db);
    args.store.database_url = Some(proxy.pg_url(&db));
    args.primary_probe_interval = Duration::from_millis(200);
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    let before = submission("AWD-C", "2026-11-29T10:00:00Z", b"before", 3);
    c.submit(before.clone()).await.unwrap();

    proxy.cut();
    let started = Instant::now();
    let err = c
        .submit(submission("AWD-C", "2026-11-29T10:00:00Z", b"during", 4))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(waited < Duration::from_secs(8), "{waited:?}");
    println!("database cut: UNAVAILABLE after {waited:?}");
    // The identity probe has failed by now: the cached duplicate waits for
    // the primary to be confirmed (DESIGN §7.2).
    let err = c.submit(before.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    proxy.restore();
    let cached = eventually(Duration::from_secs(15), || {
        let (mut c, before) = (c.clone(), before.clone());
        async move {
            let d = c.submit(before).await.ok().map(|d| d.into_inner());
            d.is_some_and(|d| (outcome(&d), tier(&d)) == (Outcome::Duplicate, Tier::LocalCache))
        }
    })
    .await;
    assert!(cached, "L1 answers again once the same primary is confirmed");
    let retried = eventually(Duration::from_secs(15), || {
        let mut c = c.clone();
        async move {
            c.submit(submission("AWD-C", "2026-11-29T10:00:00Z", b"during", 4))
                .await
                .is_ok()
        }
    })
    .await;
    assert!(retried, "serving again once the database is back");
    assert_eq!(db.counts().await.ledger(), (2, 2, 7, 2));
}

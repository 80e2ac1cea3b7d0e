//! OpenTelemetry traces (DESIGN §11) with real parts: the `oncegate serve`
//! binary exports over OTLP/gRPC to a receiver in this test (the collector's
//! own service, from the `opentelemetry-proto` crate), continuing the
//! `traceparent` the client set; the broker message carries the trace on.

use crate::helpers::*;
use crate::relay::xrange;
use oncegate::pb::{self, Outcome, Tier};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TS: &str = "2026-12-03T10:00:00Z";
/// The caller's trace and span (the consumer's own span around `Submit`).
const TRACE_ID: &str = "5b8efff798038103d269b633813fc60c";
const CALLER_SPAN: &str = "eee19b7ec3c1b174";

/// An OTLP trace receiver: keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    async fn start() -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = Self::default();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (receiver, addr)
    }

    fn of_trace(&self, trace_id: &str) -> Vec<Span> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| hex::encode(&s.trace_id) == trace_id)
            .cloned()
            .collect()
    }

    /// The trace's spans once every name in `names` is among them, as
    /// often as it is in `names` (spans arrive in batches of their own).
    async fn wait_for(&self, trace_id: &str, names: &[&str]) -> Vec<Span> {
        let count = |among: &[&str], n: &str| among.iter().filter(|m| **m == n).count();
        let complete = |spans: &[Span]| {
            let got: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
            names.iter().all(|n| count(&got, n) >= count(names, n))
        };
        eventually(Duration::from_secs(20), || async {
            complete(&self.of_trace(trace_id))
        })
        .await;
        self.of_trace(trace_id)
    }
}

fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Value::StringValue(s)) => s,
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// The trace as an indented tree (name, duration, the attributes oncegate
/// sets), printed by the tests for the record (`--nocapture`).
fn render(spans: &[Span]) -> String {
    fn walk(spans: &[Span], parent: &[u8], depth: usize, out: &mut String) {
        let mut children: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == parent).collect();
        children.sort_by_key(|s| s.start_time_unix_nano);
        for s in children {
            let us = s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano) / 1000;
            let mut attrs: Vec<(String, String)> = attributes(s)
                .into_iter()
                .filter(|(k, _)| {
                    k.starts_with("oncegate.")
                        || k.starts_with("rpc.method")
                        || k.starts_with("messaging.system")
                        || k == "db.system"
                })
                .collect();
            attrs.sort();
            let attrs: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!(
                "{}{} {us} µs {}\n",
                "  ".repeat(depth),
                s.name,
                attrs.join(" ")
            ));
            walk(spans, &s.span_id, depth + 1, out);
        }
    }
    let mut out = String::new();
    let caller = hex::decode(CALLER_SPAN).unwrap();
    out.push_str(&format!("(caller span {CALLER_SPAN})\n"));
    walk(spans, &caller, 1, &mut out);
    out
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn traceparent_of(span: &Span) -> String {
    format!(
        "00-{}-{}-01",
        hex::encode(&span.trace_id),
        hex::encode(&span.span_id)
    )
}

/// `submission` sent with the caller's `traceparent` in the metadata.
fn traced(s: pb::Submission, traceparent: &str) -> tonic::Request<pb::Submission> {
    let mut req = tonic::Request::new(s);
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    req
}

/// A sidecar exporting to `receiver` with the relay on `sink`.
async fn traced_sidecar(db: &TestDb, receiver: SocketAddr, sink: &str, stream: &str) -> Sidecar {
    Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("REDIS_URL", redis_url()),
        ("ONCEGATE_REDIS_KEY_PREFIX", unique("og-it-trace:")),
        ("ONCEGATE_RELAY_SINK", sink.to_string()),
        ("ONCEGATE_RELAY_STREAM", stream.to_string()),
        (
            "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
            unique("og-it-txn-"),
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}")),
        ("OTEL_SERVICE_NAME", "oncegate-it".into()),
        // Export within a few hundred milliseconds, not the default 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
    ])
    .await
}

/// Submits once (claimed) and again (an L1 duplicate) under the caller's
/// trace, and checks the span tree the receiver got; returns the
/// `traceparent` the relay's publish span hands on.
async fn submit_and_check_spans(app: &Sidecar, receiver: &Receiver, payload: &str) -> String {
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let mut c = app.client().await;
    let s = submission("AWD-T1", TS, payload.as_bytes(), 700);
    let first = c.submit(traced(s.clone(), &caller)).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    let again = c.submit(traced(s, &caller)).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&again), tier(&again)),
        (Outcome::Duplicate, Tier::LocalCache)
    );
    let wanted = [
        "oncegate.v1.Gate/Submit",
        "oncegate.v1.Gate/Submit",
        "l1.get",
        "l1.get",
        "l2.lease",
        "group_commit.wait",
        "claim_batch",
        "relay.publish",
    ];
    let spans = receiver.wait_for(TRACE_ID, &wanted).await;
    eprintln!("{}", render(&spans));
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    for n in wanted {
        assert!(names.contains(&n), "span {n} in {names:?}");
    }
    let servers = named(&spans, "oncegate.v1.Gate/Submit");
    assert_eq!(servers.len(), 2, "{names:?}");
    for s in &servers {
        assert_eq!(
            hex::encode(&s.parent_span_id),
            CALLER_SPAN,
            "the caller's span is the parent"
        );
        assert_eq!(s.kind, 2, "SPAN_KIND_SERVER");
    }
    let decided: Vec<(String, String)> = servers
        .iter()
        .map(|s| {
            let a = attributes(s);
            (a["oncegate.decision"].clone(), a["oncegate.tier"].clone())
        })
        .collect();
    assert!(
        decided.contains(&("CLAIMED".into(), "DATABASE".into())),
        "{decided:?}"
    );
    assert!(
        decided.contains(&("DUPLICATE".into(), "LOCAL_CACHE".into())),
        "{decided:?}"
    );
    let claimed = servers
        .iter()
        .find(|s| attributes(s)["oncegate.decision"] == "CLAIMED")
        .unwrap();
    let claimed_id = claimed.span_id.clone();
    for child in ["l2.lease", "group_commit.wait", "claim_batch"] {
        let s = named(&spans, child)[0];
        assert_eq!(
            s.parent_span_id, claimed_id,
            "{child} is a child of the claimed Submit"
        );
    }
    assert_eq!(named(&spans, "l1.get").len(), 2, "one L1 lookup per Submit");
    let batch = attributes(named(&spans, "claim_batch")[0]);
    assert_eq!(batch["oncegate.batch_size"], "1");
    let publish = named(&spans, "relay.publish")[0];
    assert_eq!(
        publish.parent_span_id, claimed_id,
        "the publish continues the Submit's trace"
    );
    assert_eq!(publish.kind, 4, "SPAN_KIND_PRODUCER");
    for s in &spans {
        for v in attributes(s).values() {
            assert!(!v.contains(payload), "no payload in span {}: {v}", s.name);
        }
    }
    traceparent_of(publish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_spans_reach_the_otlp_receiver_and_the_redis_stream_carries_the_trace() {
    let (receiver, addr) = Receiver::start().await;
    let db = TestDb::new(Kind::Postgres).await;
    let stream = unique("og-it-trace-");
    let app = traced_sidecar(&db, addr, &redis_url(), &stream).await;
    let sent = submit_and_check_spans(&app, &receiver, &unique("payload-secret-")).await;
    let entries = xrange(&stream).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0]["traceparent"], sent,
        "the stream entry continues the trace"
    );
    assert!(app.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_record_carries_the_trace() {
    let (receiver, addr) = Receiver::start().await;
    let db = TestDb::new(Kind::Postgres).await;
    let topic = unique("og-it-trace-");
    let sink = format!("kafka://{}", crate::kafka::bootstrap());
    let app = traced_sidecar(&db, addr, &sink, &topic).await;
    let sent = submit_and_check_spans(&app, &receiver, &unique("payload-secret-")).await;
    let headers = kafka_headers(&topic).await;
    assert_eq!(headers.len(), 1, "{headers:?}");
    assert_eq!(headers[0].get("traceparent"), Some(&sent), "{headers:?}");
    assert!(app.terminate().await.success());
}

/// With traces off the sidecar exports nothing, but the event still carries
/// the caller's trace context (well formed only), so the consumer continues
/// the caller's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_traces_off_the_event_carries_the_callers_traceparent() {
    let db = TestDb::new(Kind::Sqlite).await;
    let stream = unique("og-it-trace-off-");
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", redis_url()),
        ("ONCEGATE_RELAY_STREAM", stream.clone()),
    ])
    .await;
    let mut c = app.client().await;
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let s = submission("AWD-T2", TS, b"off-1", 100);
    c.submit(traced(s, &caller)).await.unwrap();
    let s = submission("AWD-T2", TS, b"off-2", 100);
    c.submit(traced(s, "00-not-a-trace-context-01")).await.unwrap();
    c.submit(submission("AWD-T2", TS, b"off-3", 100)).await.unwrap();
    let published = eventually(Duration::from_secs(20), || {
        let stream = stream.clone();
        async move { xrange(&stream).await.len() == 3 }
    })
    .await;
    assert!(published, "{}", app.log_text());
    let entries = xrange(&stream).await;
    let carried: Vec<Option<&str>> = entries
        .iter()
        .map(|e| e.get("traceparent").map(String::as_str))
        .collect();
    assert_eq!(carried, [Some(caller.as_str()), None, None]);
    assert!(app.terminate().await.success());
}

/// The headers of every read_committed record in `topic`, once the first
/// has arrived.
async fn kafka_headers(topic: &str) -> Vec<HashMap<String, String>> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", crate::kafka::bootstrap())
        .set("group.id", unique("og-it-trace-reader-"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("kafka consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut all = Vec::new();
        while std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) if m.topic() == topic => {
                    let headers = m.headers().map_or_else(HashMap::new, |h| {
                        h.iter()
                            .map(|h| {
                                let v = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                                (h.key.to_string(), v.unwrap_or_default())
                            })
                            .collect()
                    });
                    all.push(headers);
                }
                _ if !all.is_empty() => break,
                _ => {}
            }
        }
        all
    })
    .await
    .unwrap()
}

/// A sidecar with traces off relaying to `sink`; submits one delivery with
/// the caller's `traceparent` and waits until the outbox is published.
async fn relay_one_traced(sink: &str, stream: &str, subject: &str) -> (Sidecar, TestDb, String) {
    let db = TestDb::new(Kind::Sqlite).await;
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", sink.to_string()),
        ("ONCEGATE_RELAY_STREAM", stream.to_string()),
        ("ONCEGATE_RELAY_SUBJECT", subject.to_string()),
    ])
    .await;
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let s = submission("AWD-T3", TS, b"relayed", 100);
    app.client().await.submit(traced(s, &caller)).await.unwrap();
    let published = eventually(Duration::from_secs(20), || async {
        db.scalar("select count(*) from outbox where published_at is null")
            .await
            == 0
    })
    .await;
    assert!(published, "{}", app.log_text());
    (app, db, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jetstream_message_carries_the_trace() {
    let stream = crate::relay::TestStream::new().await;
    let (app, _db, caller) = relay_one_traced(&nats_url(), &stream.name, &stream.subject).await;
    let mut js = stream.js.get_stream(&stream.name).await.unwrap();
    let first = js.info().await.unwrap().state.first_sequence;
    let m = js.get_raw_message(first).await.unwrap();
    let header = m.headers.get("traceparent").map(|v| v.as_str().to_string());
    assert_eq!(header.as_deref(), Some(caller.as_str()));
    assert!(app.terminate().await.success());
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amqp_message_carries_the_trace() {
    use lapin::options::BasicGetOptions;
    use lapin::types::AMQPValue;
    let exchange = unique("og-it-trace-amqp-");
    crate::kafka::bind_queue(&exchange).await;
    let (app, _db, caller) = relay_one_traced(&crate::relay::amqp_url(), &exchange, "oncegate.events").await;
    let conn = lapin::Connection::connect(&crate::relay::amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("{exchange}.q");
    let got = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the event is in the bound queue");
    let headers = got.properties.headers().clone().unwrap_or_default();
    let header = match headers.inner().get("traceparent") {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        _ => None,
    };
    assert_eq!(header.as_deref(), Some(caller.as_str()));
    let _ = conn.close(0, "done".into()).await;
    assert!(app.terminate().await.success());
}

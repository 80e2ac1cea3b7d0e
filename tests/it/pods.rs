//! The relay across pods (DESIGN §4.2): several `oncegate
//! serve` processes with the relay on, one Postgres, claims streaming in
//! through every pod, and the pods replaced, lost, cut off and scaled the
//! way a cluster would. Afterwards a `read_committed` reader finds every
//! event in the Kafka topic exactly once and every award in sequence order;
//! on Redis Streams every event at least once with its event id and every
//! award's first deliveries in sequence order.
//!
//! Faults are injected once the state they need is there (a pod holding
//! slots and publishing, the survivors holding a lost pod's slots), never
//! asserted to have landed at any particular point: the guarantee must hold
//! wherever they land. Leases are short (2 s) so that each test streams for
//! a few seconds only.

use crate::helpers::*;
use crate::kafka::{ThrowawayKafka, event_id_of, kafka_url, outbox_list, read_back};
use crate::relay::xrange_at;
use oncegate::broker::BrokerEntry;
use oncegate::pb::gate_client::GateClient;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

const TS: &str = "2026-12-05T10:00:00Z";

/// Slots in these tests: more than the most pods any test runs, not a
/// multiple of every pod count.
const SLOTS: usize = 5;

/// Where the pods publish.
#[derive(Clone)]
pub enum Sink {
    Kafka { url: String, topic: String },
    Redis { url: String, stream: String },
}

impl Sink {
    pub fn kafka(url: String) -> Self {
        Self::Kafka {
            url,
            topic: unique("og-it-pods-"),
        }
    }

    fn redis() -> Self {
        Self::Redis {
            url: redis_url(),
            stream: unique("og-it-pods-"),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Kafka { url, topic } => vec![
                ("ONCEGATE_RELAY_SINK", url.clone()),
                ("ONCEGATE_RELAY_STREAM", topic.clone()),
                (
                    "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
                    format!("{topic}-"),
                ),
            ],
            Self::Redis { url, stream } => vec![
                ("ONCEGATE_RELAY_SINK", url.clone()),
                ("ONCEGATE_RELAY_STREAM", stream.clone()),
            ],
        }
    }
}

/// A Deployment's pods: each started under a new name.
pub struct Pods {
    pub db: TestDb,
    pub sink: Sink,
    pub pods: Vec<Sidecar>,
    /// Where the stream sends claims (the live pods).
    pub targets: Arc<Mutex<Vec<SocketAddr>>>,
    logs: Vec<std::path::PathBuf>,
    extra: Vec<(&'static str, String)>,
}

impl Pods {
    async fn new(sink: Sink) -> Self {
        Self::on(TestDb::new(Kind::Postgres).await, sink)
    }

    /// A Deployment on a database the test prepared itself (migrated by
    /// another release, say).
    pub fn on(db: TestDb, sink: Sink) -> Self {
        Self {
            db,
            sink,
            pods: Vec::new(),
            targets: Arc::default(),
            logs: Vec::new(),
            extra: Vec::new(),
        }
    }

    fn env(&self, database_url: &str) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("DATABASE_URL", database_url.to_string()),
            ("ONCEGATE_INSTANCE_ID", unique("og-it-pod-")),
            ("ONCEGATE_RELAY_SLOTS", SLOTS.to_string()),
            ("ONCEGATE_RELAY_LEASE", "2s".into()),
            ("ONCEGATE_RELAY_POLL", "100ms".into()),
            ("ONCEGATE_RELAY_BATCH", "40".into()),
            ("ONCEGATE_RELAY_RETRY_BACKOFF", "50ms".into()),
            ("ONCEGATE_DB_POOL_SIZE", "4".into()),
        ];
        env.extend(self.sink.env());
        env.extend(self.extra.iter().cloned());
        env
    }

    /// A new pod (a new name), serving claims once it answers.
    async fn start(&mut self) -> usize {
        let url = self.db.url.clone();
        self.start_with(&url, Vec::new()).await
    }

    async fn start_with(&mut self, database_url: &str, more: Vec<(&'static str, String)>) -> usize {
        self.start_release(&oncegate_bin(), database_url, more).await
    }

    /// A new pod running `bin` (another release of `oncegate`).
    pub async fn start_release(
        &mut self,
        bin: &std::path::Path,
        database_url: &str,
        more: Vec<(&'static str, String)>,
    ) -> usize {
        let mut env = self.env(database_url);
        env.extend(more);
        let pod = Sidecar::start_bin(bin, &env).await;
        self.targets.lock().unwrap().push(pod.addr);
        self.logs.push(pod.log.clone());
        self.pods.push(pod);
        self.pods.len() - 1
    }

    fn untarget(&self, addr: SocketAddr) {
        self.targets.lock().unwrap().retain(|a| *a != addr);
    }

    /// SIGKILL, as a node failure or an evicted pod.
    async fn kill(&mut self, i: usize) {
        let pod = self.pods.remove(i);
        self.untarget(pod.addr);
        pod.kill().await;
    }

    /// SIGTERM, as a scale-down: the pod gives its slots back.
    pub async fn terminate(&mut self, i: usize) {
        let pod = self.pods.remove(i);
        self.untarget(pod.addr);
        let status = pod.terminate().await;
        assert!(status.success(), "a terminated pod exits 0: {status:?}");
    }

    /// The slots pod `i` holds, as its metrics say.
    async fn held(&self, i: usize) -> usize {
        metric(&self.pods[i].metrics().await, "oncegate_relay_slots_held").unwrap_or(0.0) as usize
    }

    pub async fn published(&self, i: usize) -> f64 {
        let m = self.pods[i].metrics().await;
        m.lines()
            .filter(|l| l.starts_with("oncegate_outbox_published_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until pod `i` holds slots and has published since `since`
    /// (its events flow: a batch is in hand more often than not).
    pub async fn publishing(&self, i: usize, since: f64) {
        let ok = eventually(Duration::from_secs(40), || async {
            self.held(i).await > 0 && self.published(i).await > since
        })
        .await;
        assert!(ok, "pod {i} never published:\n{}", self.pods[i].log_text());
    }

    /// Waits until the live pods hold every slot, in fair shares.
    pub async fn balanced(&self) {
        let n = self.pods.len();
        let ok = eventually(Duration::from_secs(40), || async {
            let mut shares = Vec::new();
            for i in 0..n {
                shares.push(self.held(i).await);
            }
            shares.iter().sum::<usize>() == SLOTS && shares.iter().all(|s| s.abs_diff(SLOTS / n) <= 1)
        })
        .await;
        let table = slots_table(&self.db).await;
        assert!(ok, "the {n} pods never shared the {SLOTS} slots fairly:\n{table}");
    }

    /// Waits until nothing is left to publish.
    pub async fn drained(&self) {
        let ok = eventually(Duration::from_secs(90), || async {
            self.db
                .scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                .await
                == 0
        })
        .await;
        let logs: String = self.pods.iter().map(Sidecar::log_text).collect();
        assert!(
            ok,
            "the outbox never drained:\n{}\n{logs}",
            slots_table(&self.db).await
        );
    }

    /// Every event in the sink as its delivery promises, in award order;
    /// the entries read.
    pub async fn verify(&self) -> usize {
        let expected = expected_sequences(&self.db).await;
        match &self.sink {
            Sink::Kafka { url, topic } => {
                let entries = read_back(url, topic).await;
                assert_exactly_once_in_order(&entries, &expected);
                entries.len()
            }
            Sink::Redis { url, stream } => {
                let entries: Vec<BrokerEntry> = xrange_at(url, stream)
                    .await
                    .into_iter()
                    .map(|mut f| BrokerEntry {
                        position: String::new(),
                        event_id: f.remove("event_id"),
                        award_id: f.remove("award_id"),
                        sequence: f.remove("sequence"),
                        event_type: f.remove("type"),
                        body: f.remove("data"),
                    })
                    .collect();
                assert_at_least_once_in_order(&entries, &expected);
                entries.len()
            }
        }
    }

    /// How many pods settled a committed batch of an earlier holder.
    pub fn settled_in_logs(&self) -> usize {
        self.logs
            .iter()
            .map(|l| {
                std::fs::read_to_string(l)
                    .unwrap_or_default()
                    .matches("settled events an earlier transaction had published")
                    .count()
            })
            .sum()
    }

    pub async fn shutdown(mut self) {
        while !self.pods.is_empty() {
            self.terminate(0).await;
        }
    }
}

/// `oncegate outbox slots` for the test's database.
pub async fn slots_table(db: &TestDb) -> String {
    let out = tokio::process::Command::new(crate::helpers::oncegate_bin())
        .args(["outbox", "slots"])
        .env_clear()
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Each award's last sequence, from the ledger's running totals.
async fn expected_sequences(db: &TestDb) -> HashMap<String, i64> {
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    sqlx::query_as::<_, (String, i64)>("SELECT award_id, last_sequence FROM award_balances")
        .fetch_all(&mut c)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

fn award_and_sequence(e: &BrokerEntry) -> (String, i64) {
    let body: serde_json::Value = serde_json::from_str(e.body.as_deref().expect("a body")).expect("JSON");
    (
        body["award_id"].as_str().expect("award_id").to_string(),
        body["sequence"].as_i64().expect("sequence"),
    )
}

/// Each event once; each award's sequences exactly 1..=n in order.
fn assert_exactly_once_in_order(entries: &[BrokerEntry], expected: &HashMap<String, i64>) {
    let mut ids = HashSet::new();
    let mut repeated = Vec::new();
    let mut by_award: HashMap<String, Vec<i64>> = HashMap::new();
    for e in entries {
        let id = event_id_of(e).expect("an event id");
        if !ids.insert(id.clone()) {
            repeated.push(id);
        }
        let (award, sequence) = award_and_sequence(e);
        by_award.entry(award).or_default().push(sequence);
    }
    assert!(
        repeated.is_empty(),
        "{} events read twice: {repeated:?}",
        repeated.len()
    );
    for (award, last) in expected {
        let seen = by_award.remove(award).unwrap_or_default();
        assert_eq!(
            seen,
            (1..=*last).collect::<Vec<_>>(),
            "award {award}: every event once, in order"
        );
    }
    assert!(
        by_award.is_empty(),
        "awards the ledger does not have: {:?}",
        by_award.keys()
    );
}

/// Each event at least once (with its event id); each award's first
/// deliveries exactly 1..=n in order.
fn assert_at_least_once_in_order(entries: &[BrokerEntry], expected: &HashMap<String, i64>) {
    let mut ids = HashSet::new();
    let mut first: HashMap<String, Vec<i64>> = HashMap::new();
    for e in entries {
        let id = event_id_of(e).expect("an event id on every entry");
        if ids.insert(id) {
            let (award, sequence) = award_and_sequence(e);
            first.entry(award).or_default().push(sequence);
        }
    }
    for (award, last) in expected {
        let seen = first.remove(award).unwrap_or_default();
        assert_eq!(
            seen,
            (1..=*last).collect::<Vec<_>>(),
            "award {award}: first deliveries in order"
        );
    }
    eprintln!(
        "{} entries, {} events ({} repeats)",
        entries.len(),
        ids.len(),
        entries.len() - ids.len()
    );
}

/// Claims streaming into whichever pods are live, each client retrying a
/// delivery (on another pod) until it is answered, as consumers redeliver.
pub struct ClaimStream {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClaimStream {
    fn start(targets: Arc<Mutex<Vec<SocketAddr>>>, awards: usize, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let tag = unique("");
        let tasks = (0..clients)
            .map(|c| {
                let (targets, stop, answered, tag) =
                    (targets.clone(), stop.clone(), answered.clone(), tag.clone());
                tokio::spawn(async move { client(c, awards, &tag, targets, stop, answered).await })
            })
            .collect();
        Self {
            stop,
            answered,
            tasks,
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits until `n` more claims were answered.
    async fn more(&self, n: u64) {
        let from = self.answered();
        let ok = eventually(Duration::from_secs(60), || async { self.answered() >= from + n }).await;
        assert!(ok, "claims stopped flowing at {}", self.answered());
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.answered.load(Ordering::SeqCst)
    }
}

async fn client(
    c: usize,
    awards: usize,
    tag: &str,
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
) {
    let mut gates: HashMap<SocketAddr, GateClient<Channel>> = HashMap::new();
    let mut i = 0usize;
    let mut turn = c;
    while !stop.load(Ordering::SeqCst) {
        let award = format!("AWD-P{}", (c + i * 7) % awards);
        let s = submission(&award, TS, format!("{tag}-{c}-{i}").as_bytes(), 100);
        turn += 1;
        let Some(target) = ({
            let t = targets.lock().unwrap();
            (!t.is_empty()).then(|| t[turn % t.len()])
        }) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if let std::collections::hash_map::Entry::Vacant(slot) = gates.entry(target) {
            match connect(target).await {
                Some(g) => {
                    slot.insert(g);
                }
                None => continue,
            }
        }
        let gate = gates.get_mut(&target).expect("connected above");
        match tokio::time::timeout(Duration::from_secs(5), gate.submit(s)).await {
            Ok(Ok(_)) => {
                answered.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            // Not answered: the same delivery again, maybe on another pod.
            _ => {
                gates.remove(&target);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn connect(addr: SocketAddr) -> Option<GateClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1));
    match tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await {
        Ok(Ok(channel)) => Some(GateClient::new(channel)),
        _ => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Replaced one at a time, the way a Deployment rolls: each pod SIGKILLed
/// while it publishes, a new one (a new name) started, until every pod was
/// replaced.
async fn replaced_one_at_a_time(sink: Sink, n: usize) {
    let mut pods = Pods::new(sink).await;
    for _ in 0..n {
        pods.start().await;
    }
    let stream = ClaimStream::start(pods.targets.clone(), 24, 4);
    pods.balanced().await;
    for _ in 0..n {
        let since = pods.published(0).await;
        pods.publishing(0, since).await;
        pods.kill(0).await;
        stream.more(40).await;
        pods.start().await;
        pods.balanced().await;
    }
    stream.more(40).await;
    let claims = stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    eprintln!(
        "{n} pods replaced under {claims} claims; {} settles",
        pods.settled_in_logs()
    );
    pods.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_two_pods_replaced_one_at_a_time_publish_every_event_once_in_order() {
    replaced_one_at_a_time(Sink::kafka(kafka_url()), 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_three_pods_replaced_one_at_a_time_publish_every_event_once_in_order() {
    replaced_one_at_a_time(Sink::kafka(kafka_url()), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_pods_replaced_one_at_a_time_publish_every_event_in_order() {
    replaced_one_at_a_time(Sink::redis(), 2).await;
}

/// A pod SIGKILLed and not replaced for longer than the lease (a node lost
/// before its replacement is scheduled), three times: each time the pod
/// that stays takes the lost pod's slots once their lease ran out — with
/// Kafka fencing the lost pod's transactional ids and settling what it
/// committed — and a new pod joins only after that.
async fn lost_for_longer_than_the_lease(sink: Sink) {
    let mut pods = Pods::new(sink).await;
    pods.start().await;
    pods.start().await;
    let stream = ClaimStream::start(pods.targets.clone(), 24, 4);
    pods.balanced().await;
    for _ in 0..3 {
        let since = pods.published(1).await;
        pods.publishing(1, since).await;
        pods.kill(1).await;
        // The survivor holds every slot: the lost pod's leases ran out.
        pods.balanced().await;
        stream.more(40).await;
        pods.start().await;
        pods.balanced().await;
    }
    let claims = stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    eprintln!(
        "3 pods lost for longer than the lease under {claims} claims; {} settles",
        pods.settled_in_logs()
    );
    pods.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_pod_lost_for_longer_than_the_lease_again_and_again_publishes_nothing_twice() {
    lost_for_longer_than_the_lease(Sink::kafka(kafka_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pod_lost_for_longer_than_the_lease_again_and_again_keeps_award_order() {
    lost_for_longer_than_the_lease(Sink::redis()).await;
}

/// 1 → 3 → 1 pods while claims stream: joining pods get their share from
/// the pods over it (given back after the batch in hand), and pods scaled
/// away (SIGTERM) give their slots back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_scaling_one_to_three_to_one_while_claims_stream() {
    let mut pods = Pods::new(Sink::kafka(kafka_url())).await;
    pods.start().await;
    let stream = ClaimStream::start(pods.targets.clone(), 24, 4);
    pods.balanced().await;
    stream.more(40).await;
    pods.start().await;
    pods.start().await;
    pods.balanced().await;
    stream.more(40).await;
    pods.terminate(2).await;
    pods.terminate(1).await;
    // Given back at SIGTERM: the last pod holds them all well before a lease.
    pods.balanced().await;
    stream.more(40).await;
    stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    pods.shutdown().await;
}

/// A pod cut off from Postgres while it publishes: it cannot renew, stops
/// publishing before its lease runs out, and the other pod takes its slots
/// after the lease (with Kafka, fencing it and settling what it committed
/// but could not mark); when the link is back the pod finds its slots gone,
/// writes nothing for them, and takes a share again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_pod_cut_off_from_postgres_mid_batch_publishes_nothing_twice() {
    let mut pods = Pods::new(Sink::kafka(kafka_url())).await;
    let proxy = FaultProxy::start(pg_addr()).await;
    pods.start().await;
    let cut = pods.start_with(&proxy.pg_url(&pods.db), Vec::new()).await;
    let stream = ClaimStream::start(pods.targets.clone(), 24, 4);
    pods.balanced().await;
    let since = pods.published(cut).await;
    pods.publishing(cut, since).await;
    proxy.cut();
    // The other pod takes the cut pod's slots once their lease ran out.
    let ok = eventually(Duration::from_secs(30), || async { pods.held(0).await == SLOTS }).await;
    assert!(ok, "the slots never moved:\n{}", slots_table(&pods.db).await);
    stream.more(40).await;
    proxy.restore();
    pods.balanced().await;
    stream.more(40).await;
    stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    pods.shutdown().await;
}

/// The slot count changed twice while claims stream (5 → 7 → 3): every
/// slot is settled under the old count before the new one is in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_the_slot_count_changes_while_claims_stream_and_nothing_is_published_twice() {
    let mut pods = Pods::new(Sink::kafka(kafka_url())).await;
    pods.start().await;
    pods.start().await;
    let stream = ClaimStream::start(pods.targets.clone(), 24, 4);
    pods.balanced().await;
    for count in [7, 3] {
        stream.more(40).await;
        let out = resize(&pods, count).await;
        assert!(out.contains(&format!("-> {count}")), "{out}");
        let ok = eventually(Duration::from_secs(30), || async {
            pods.held(0).await + pods.held(1).await == count
        })
        .await;
        assert!(
            ok,
            "the pods never took the {count} slots:\n{}",
            slots_table(&pods.db).await
        );
    }
    stream.more(40).await;
    stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    pods.shutdown().await;
}

/// `oncegate outbox slots --set N` with the pods' sink settings.
async fn resize(pods: &Pods, count: usize) -> String {
    let mut cmd = tokio::process::Command::new(crate::helpers::oncegate_bin());
    cmd.args(["outbox", "slots", "--set", &count.to_string()])
        .env_clear()
        .env("DATABASE_URL", &pods.db.url);
    for (k, v) in pods.sink.env() {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

/// A broker of the test's own that creates no topics on first use (the
/// usual production setting), with a listener per pod behind a proxy of
/// its own. The topic is missing at first: the relay pauses and says so —
/// in its log, `outbox list` and a metric label naming the topic — without
/// spending attempts; once the topic is created, events flow. Then one pod
/// is cut off from Kafka mid-batch and comes back: nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_missing_topic_is_named_and_a_pod_cut_off_from_kafka_publishes_nothing_twice() {
    let (proxy_a, proxy_b) = (ListenerProxy::new().await, ListenerProxy::new().await);
    let broker = ThrowawayKafka::with_options(vec![
        "--no-auto-create".into(),
        "--listener".into(),
        proxy_a.listener("PODA"),
        "--listener".into(),
        proxy_b.listener("PODB"),
    ])
    .await;
    let sink = Sink::kafka(broker.url());
    let Sink::Kafka { topic, .. } = sink.clone() else {
        unreachable!()
    };
    let mut pods = Pods::new(sink).await;
    let db_url = pods.db.url.clone();
    let a = pods
        .start_with(&db_url, vec![("ONCEGATE_RELAY_SINK", proxy_a.kafka_url())])
        .await;
    pods.start_with(&db_url, vec![("ONCEGATE_RELAY_SINK", proxy_b.kafka_url())])
        .await;
    let stream = ClaimStream::start(pods.targets.clone(), 24, 2);
    stream.more(20).await;
    topic_missing_is_named(&pods, a, &topic).await;
    create_topic(&broker.url(), &topic, 3, &[]).await;
    pods.balanced().await;
    let since = pods.published(a).await;
    pods.publishing(a, since).await;
    proxy_a.proxy.cut();
    let paused = eventually(Duration::from_secs(30), || async {
        metric(
            &pods.pods[a].metrics().await,
            "oncegate_relay_breaker_state{sink=\"kafka\"}",
        ) == Some(1.0)
    })
    .await;
    assert!(paused, "the cut pod pauses:\n{}", pods.pods[a].log_text());
    stream.more(40).await;
    proxy_a.proxy.restore();
    let since = pods.published(a).await;
    pods.publishing(a, since).await;
    stream.more(20).await;
    stream.stop().await;
    pods.drained().await;
    pods.verify().await;
    let attempts = pods
        .db
        .scalar("SELECT count(*) FROM outbox WHERE attempts > 0")
        .await;
    assert_eq!(attempts, 0, "no attempts spent on a missing topic or a cut link");
    pods.shutdown().await;
}

/// The topic missing: paused, named in the log, `outbox list` and the
/// outage metric; nothing published, no attempts spent.
async fn topic_missing_is_named(pods: &Pods, a: usize, topic: &str) {
    let label =
        format!("oncegate_relay_outage{{sink=\"kafka\",cause=\"topic_missing\",resource=\"{topic}\"}}");
    let named = eventually(Duration::from_secs(30), || async {
        metric(&pods.pods[a].metrics().await, &label) == Some(1.0)
    })
    .await;
    assert!(named, "{label}:\n{}", pods.pods[a].metrics().await);
    let log = pods.pods[a].log_containing(topic, Duration::from_secs(5)).await;
    assert!(
        log.contains("destination unusable; relay paused") && log.contains("does not exist"),
        "the log names the topic:\n{log}"
    );
    let listed = outbox_list(&pods.db, &pods.pods[a]).await;
    assert!(
        listed.contains(&format!("topic \"{topic}\" does not exist")),
        "outbox list names the topic:\n{listed}"
    );
    assert_eq!(
        pods.db
            .scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL OR attempts > 0")
            .await,
        0
    );
}

/// A proxy in front of one of the broker's listeners: the listener tells
/// its clients the broker is at the proxy, so cutting the proxy cuts only
/// the pod that bootstrapped through it.
struct ListenerProxy {
    port: u16,
    proxy: FaultProxy,
}

impl ListenerProxy {
    async fn new() -> Self {
        let port = free_port();
        let proxy = FaultProxy::start(format!("127.0.0.1:{port}").parse().unwrap()).await;
        Self { port, proxy }
    }

    /// The `scripts/kafka --listener` value for this proxy.
    fn listener(&self, name: &str) -> String {
        format!("{name},{},{}", self.port, self.proxy.addr)
    }

    fn kafka_url(&self) -> String {
        format!("kafka://{}", self.proxy.addr)
    }
}

//! The L2 tier on a real Redis Cluster: three masters and three replicas
//! started by the test on loopback, and the master holding a key's slot
//! killed mid-run. The tier keys are `<prefix><idempotency key>`, one key per
//! command (SET NX GET, SET, GET, a one-key compare-and-delete script), so
//! no hash tags are needed: every command goes to the key's own slot.

use crate::helpers::*;
use oncegate::pb::{Outcome, Tier};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

const TS: &str = "2026-11-29T10:00:00Z";

/// Six `redis-server --cluster-enabled yes` processes and the cluster made
/// of them by `redis-cli --cluster create`.
struct RedisCluster {
    /// Holds the nodes' config files for the cluster's life.
    _dir: tempfile::TempDir,
    nodes: Vec<(u16, Option<Child>)>,
}

fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Six consecutive free ports whose cluster-bus ports (+10000) are free too.
fn cluster_ports() -> Vec<u16> {
    loop {
        let base = 20_000 + (rand_u16() % 20_000);
        let ports: Vec<u16> = (base..base + 6).collect();
        if ports.iter().all(|p| port_is_free(*p) && port_is_free(p + 10_000)) {
            return ports;
        }
    }
}

fn rand_u16() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 65_536) as u16
}

async fn redis_cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(args)
        .output()
        .await
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl RedisCluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for port in cluster_ports() {
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    // Let a replica take over however long it was apart
                    // from its master (the default refuses after 10 node
                    // timeouts without contact).
                    "--cluster-replica-validity-factor",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    dir.path().to_str().unwrap(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("redis-server on PATH");
            nodes.push((port, Some(child)));
        }
        for (port, _) in &nodes {
            let port = *port;
            assert!(eventually(Duration::from_secs(5), || async move { !port_is_free(port) }).await);
        }
        let addrs: Vec<String> = nodes.iter().map(|(p, _)| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        redis_cli(&args).await;
        let cluster = Self { _dir: dir, nodes };
        assert!(
            cluster.wait_until_ok(Duration::from_secs(20)).await,
            "the cluster formed"
        );
        cluster
    }

    fn live_port(&self) -> u16 {
        self.nodes.iter().find(|(_, c)| c.is_some()).unwrap().0
    }

    /// Waits until every live node says `cluster_state:ok`. Each node
    /// decides that for itself (a master only some time after it started,
    /// and only once gossip told it every slot is served): until then it
    /// answers CLUSTERDOWN, and a tier write sent to it is lost, so one
    /// node's word is not enough.
    async fn wait_until_ok(&self, timeout: Duration) -> bool {
        eventually(timeout, || async {
            for (port, child) in &self.nodes {
                if child.is_none() {
                    continue;
                }
                let info = redis_cli(&["-p", &port.to_string(), "cluster", "info"]).await;
                if !info.contains("cluster_state:ok") {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// fred's cluster URL: one seed node and the others as `node=`.
    fn url(&self) -> String {
        let mut ports = self.nodes.iter().map(|(p, _)| *p);
        let first = ports.next().unwrap();
        let rest: Vec<String> = ports.map(|p| format!("node=127.0.0.1:{p}")).collect();
        format!("redis-cluster://127.0.0.1:{first}?{}", rest.join("&"))
    }

    /// The port of the master serving `key`'s slot now (`None` while no
    /// healthy master does, mid-failover).
    async fn master_of(&self, key: &str) -> Option<u16> {
        let port = self.live_port().to_string();
        let slot: u32 = redis_cli(&["-p", &port, "cluster", "keyslot", key])
            .await
            .trim()
            .parse()
            .unwrap();
        let nodes = redis_cli(&["-p", &port, "cluster", "nodes"]).await;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                match (lo.parse::<u32>(), hi.parse::<u32>()) {
                    (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                    _ => false,
                }
            });
            if serves {
                let addr = fields[1].split('@').next().unwrap();
                return addr.rsplit(':').next().unwrap().parse().ok();
            }
        }
        None
    }

    /// Waits until every replica of the master on `port` has acknowledged
    /// everything the master had written when this was called (its
    /// `offset=` in the master's INFO replication reaches the master's
    /// `master_repl_offset`).
    async fn replicated(&self, port: u16, within: Duration) -> bool {
        let port = port.to_string();
        let info = redis_cli(&["-p", &port, "info", "replication"]).await;
        let field = |text: &str, name: &str| -> Option<i64> {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .and_then(|v| v.parse().ok())
        };
        let Some(written) = field(&info, "master_repl_offset:") else {
            return false;
        };
        eventually(within, || async {
            let info = redis_cli(&["-p", &port, "info", "replication"]).await;
            let acked: Vec<i64> = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .filter_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")))
                .filter_map(|o| o.parse().ok())
                .collect();
            !acked.is_empty() && acked.iter().all(|o| *o >= written)
        })
        .await
    }

    async fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|(p, _)| *p == port).unwrap();
        if let Some(mut child) = node.1.take() {
            child.kill().await.unwrap();
            let _ = child.wait().await;
        }
    }
}

/// Submits and returns (outcome, tier, disbursement id).
async fn submit(app: &TestApp, s: &oncegate::pb::Submission) -> (Outcome, Tier, String) {
    let d = app
        .client()
        .await
        .submit(s.clone())
        .await
        .expect("answered")
        .into_inner();
    (outcome(&d), tier(&d), d.disbursement.unwrap().id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l2_on_redis_cluster_survives_the_failover_of_a_keys_master() {
    let mut cluster = RedisCluster::start().await;
    let db = TestDb::new(Kind::Postgres).await;
    let prefix = unique("oncegate-it:");
    let url = cluster.url();
    let spawn = || TestApp::spawn(with_redis(serve_args(&db), &url, &prefix));
    let writer = spawn().await;
    let subs: Vec<_> = (0..20)
        .map(|i| submission("AWD-CLUSTER", TS, format!("c{i}").as_bytes(), 10))
        .collect();
    let mut ids = Vec::new();
    for s in &subs {
        let (o, t, id) = submit(&writer, s).await;
        assert_eq!((o, t), (Outcome::Claimed, Tier::Database));
        ids.push(id);
    }
    // A second instance (its own, empty L1) answers every redelivery from
    // the cluster: the results are spread over all three masters.
    let reader = spawn().await;
    for (s, id) in subs.iter().zip(&ids) {
        assert_eq!(
            submit(&reader, s).await,
            (Outcome::Duplicate, Tier::Redis, id.clone())
        );
    }
    reader.shutdown().await;

    let key = format!("{prefix}{}", oncegate::key::derive_key("AWD-CLUSTER", TS, b"c0"));
    let master = cluster.master_of(&key).await.expect("the key's master");
    // Replication is asynchronous: the kill waits until the key's replica has it.
    assert!(
        cluster.replicated(master, Duration::from_secs(30)).await,
        "the replica of {master} acknowledges the master's writes"
    );
    cluster.kill(master).await;

    // During the failover: every redelivery is still the stored result
    // (from Redis where its master lives, else from the database), and a
    // fresh submission is claimed once.
    let during = spawn().await;
    for (s, id) in subs.iter().zip(&ids) {
        let (o, _, got) = submit(&during, s).await;
        assert_eq!(
            (o, &got),
            (Outcome::Duplicate, id),
            "never a wrong answer during the failover"
        );
    }
    let fresh = submission("AWD-CLUSTER", TS, b"during the failover", 10);
    assert_eq!(submit(&during, &fresh).await.0, Outcome::Claimed);
    during.shutdown().await;

    let moved = eventually(Duration::from_secs(30), || async {
        cluster.master_of(&key).await.is_some_and(|p| p != master)
    })
    .await;
    if !moved {
        let port = cluster.live_port().to_string();
        eprintln!(
            "killed {master}; cluster nodes now:\n{}",
            redis_cli(&["-p", &port, "cluster", "nodes"]).await
        );
    }
    assert!(moved, "the slot moved to the replica");
    assert!(
        cluster.wait_until_ok(Duration::from_secs(30)).await,
        "a replica took over"
    );
    // After the failover a new instance finds c0's result on the promoted
    // replica again (it was replicated before the kill).
    let after = spawn().await;
    let found = eventually(Duration::from_secs(15), || async {
        let again = spawn().await;
        let (o, t, id) = submit(&again, &subs[0]).await;
        again.shutdown().await;
        o == Outcome::Duplicate && t == Tier::Redis && id == ids[0]
    })
    .await;
    assert!(found, "the promoted replica serves the result");
    assert_eq!(submit(&after, &fresh).await.0, Outcome::Duplicate);
    after.shutdown().await;
    writer.shutdown().await;
    assert_eq!(
        db.counts().await.ledger(),
        (21, 21, 210, 21),
        "one ledger row per submission"
    );
}

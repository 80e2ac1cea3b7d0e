//! Security: loopback by default, TLS and mutual TLS with certificates made
//! in the test, payloads never in logs (even at trace level), and a service
//! role that cannot change or remove the ledger or the audit trail.

use crate::helpers::*;
use base64::Engine;
use clap::Parser;
use oncegate::cli::{Cli, Command};
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{self, Outcome};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const TS: &str = "2026-11-29T10:00:00Z";

// ---- loopback by default ----------------------------------------------------------

#[test]
fn default_listeners_are_loopback_and_plaintext_is_opt_in_to_tls() {
    let Command::Serve(args) = Cli::try_parse_from(["oncegate", "serve"]).unwrap().command else {
        unreachable!()
    };
    assert_eq!(args.listen, "127.0.0.1:50051".parse::<SocketAddr>().unwrap());
    assert!(args.metrics.metrics_listen.ip().is_loopback());
    assert!(args.health_listen.is_none());
    assert!(args.tls.tls_cert.is_none() && args.tls.tls_client_ca.is_none());
}

/// Inodes of the sockets `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|s| s.strip_suffix(']'))
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(local address hex, port)` of every listening TCP socket among `inodes`.
fn listening(inodes: &[String]) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && inodes.iter().any(|i| i == cols[9]) {
                let (addr, port) = cols[1].split_once(':').unwrap();
                out.push((addr.to_string(), u16::from_str_radix(port, 16).unwrap()));
            }
        }
    }
    out
}

/// The real binary with no ONCEGATE_LISTEN (nor metrics address) binds
/// 127.0.0.1 only: every listening socket it owns is on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_listens_on_loopback_when_no_address_is_configured() {
    let db = TestDb::new(Kind::Postgres).await;
    let log = std::env::temp_dir()
        .join(unique("oncegate-default-bind-"))
        .with_extension("log");
    let mut child = tokio::process::Command::new(oncegate_bin())
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("ONCEGATE_PURGE_INTERVAL", "0s")
        .env("ONCEGATE_DB_POOL_SIZE", "2")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let up = eventually(Duration::from_secs(20), || async {
        listening(&socket_inodes(pid)).len() >= 2
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(up, "did not start listening: {text}");
    let sockets = listening(&socket_inodes(pid));
    assert!(sockets.contains(&("0100007F".into(), 50051)), "{sockets:?}");
    assert!(sockets.contains(&("0100007F".into(), 9464)), "{sockets:?}");
    assert!(
        sockets.iter().all(|(addr, _)| addr == "0100007F"),
        "only 127.0.0.1: {sockets:?}"
    );
    assert!(text.contains("listening on 127.0.0.1:50051"), "{text}");
    let _ = child.kill().await;
}

// ---- TLS and mutual TLS ---------------------------------------------------------

/// A certificate authority made in the test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// `(certificate PEM, key PEM)` for `name`, for a server or a client.
    fn leaf(&self, name: &str, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    other_ca: Ca,
}

impl Pki {
    fn new() -> Self {
        let pki = Self {
            dir: tempfile::tempdir().unwrap(),
            ca: Ca::new("oncegate test CA"),
            other_ca: Ca::new("somebody else's CA"),
        };
        let (cert, key) = pki.ca.leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
        pki.write("server.pem", &cert);
        pki.write("server.key", &key);
        pki.write("ca.pem", &pki.ca.pem);
        pki
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).unwrap();
    }

    fn serve_args(&self, db: &TestDb, mutual: bool) -> oncegate::config::ServeArgs {
        let mut args = serve_args(db);
        args.tls.tls_cert = Some(self.dir.path().join("server.pem"));
        args.tls.tls_key = Some(self.dir.path().join("server.key"));
        if mutual {
            args.tls.tls_client_ca = Some(self.dir.path().join("ca.pem"));
        }
        args
    }
}

/// Connects over TLS and submits once; any failure is the error string.
async fn tls_submit(
    addr: SocketAddr,
    trust: Option<&str>,
    identity: Option<&(String, String)>,
    payload: &[u8],
) -> Result<pb::Decision, String> {
    let mut tls = ClientTlsConfig::new().domain_name("localhost");
    if let Some(ca) = trust {
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel: Channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    GateClient::new(channel)
        .submit(submission("AWD-TLS", TS, payload, 10))
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{s:?}"))
}

async fn plaintext_submit(addr: SocketAddr) -> Result<pb::Decision, String> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    GateClient::new(channel)
        .submit(submission("AWD-TLS", TS, b"plaintext", 10))
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let pki = Pki::new();
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(pki.serve_args(&db, false)).await;

    let d = tls_submit(app.addr, Some(&pki.ca.pem), None, b"over tls")
        .await
        .unwrap();
    assert_eq!(outcome(&d), Outcome::Claimed);
    let plain = plaintext_submit(app.addr).await;
    assert!(plain.is_err(), "plaintext against TLS: {plain:?}");
    let untrusted = tls_submit(app.addr, Some(&pki.other_ca.pem), None, b"wrong ca").await;
    assert!(
        untrusted.is_err(),
        "a client that does not trust the CA: {untrusted:?}"
    );
    assert_eq!(db.counts().await.disbursements, 1, "only the TLS call wrote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate_signed_by_the_client_ca() {
    let pki = Pki::new();
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(pki.serve_args(&db, true)).await;
    let client = pki.ca.leaf("consumer", ExtendedKeyUsagePurpose::ClientAuth);
    let stranger = pki.other_ca.leaf("consumer", ExtendedKeyUsagePurpose::ClientAuth);

    let d = tls_submit(app.addr, Some(&pki.ca.pem), Some(&client), b"mtls")
        .await
        .unwrap();
    assert_eq!(outcome(&d), Outcome::Claimed);
    let anonymous = tls_submit(app.addr, Some(&pki.ca.pem), None, b"no cert").await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let foreign = tls_submit(app.addr, Some(&pki.ca.pem), Some(&stranger), b"foreign").await;
    assert!(foreign.is_err(), "a certificate from another CA: {foreign:?}");
    let plain = plaintext_submit(app.addr).await;
    assert!(plain.is_err(), "plaintext against mTLS: {plain:?}");
    assert_eq!(
        db.counts().await.disbursements,
        1,
        "only the authenticated call wrote"
    );
}

// ---- payloads never in logs -------------------------------------------------------

/// Every spelling of `payload` a log line could carry.
fn spellings(payload: &[u8]) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    vec![
        String::from_utf8_lossy(payload).into_owned(),
        hex::encode(payload),
        hex::encode_upper(payload),
        STANDARD.encode(payload),
        STANDARD_NO_PAD.encode(payload),
        URL_SAFE.encode(payload),
        URL_SAFE_NO_PAD.encode(payload),
        format!("{payload:?}"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_bytes_never_appear_in_logs_even_at_trace_level() {
    for format in ["text", "json"] {
        let db = TestDb::new(Kind::Postgres).await;
        let marker = unique("PAYLOAD-SECRET-");
        let payload = format!("{{\"ssn\":\"{marker}\"}}").into_bytes();
        let invalid_payload = unique("INVALID-PAYLOAD-SECRET-").into_bytes();
        let sidecar = Sidecar::start(&[
            ("DATABASE_URL", db.url.clone()),
            ("RUST_LOG", "trace".into()),
            ("ONCEGATE_LOG_FORMAT", format.into()),
            ("ONCEGATE_RELAY_SINK", "log".into()),
            ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "100ms".into()),
        ])
        .await;
        let mut c = sidecar.client().await;
        let ok = submission("AWD-LOG", TS, &payload, 10);
        assert_eq!(
            outcome(&c.submit(ok.clone()).await.unwrap().into_inner()),
            Outcome::Claimed
        );
        assert_eq!(
            outcome(&c.submit(ok.clone()).await.unwrap().into_inner()),
            Outcome::Duplicate
        );
        let mut reused = submission("AWD-LOG", TS, &invalid_payload, 10);
        reused.idempotency_key = Some("producer-key-1".into());
        c.submit(reused.clone()).await.unwrap();
        reused.payload = payload.clone();
        assert!(c.submit(reused).await.is_err(), "key reuse is refused");
        let invalid = [
            submission("AWD-LOG", TS, &invalid_payload, 0),
            submission("AWD-LOG", "not a time", &invalid_payload, 5),
            submission("", TS, &invalid_payload, 5),
            submission("AWD|LOG", TS, &invalid_payload, 5),
        ];
        for s in &invalid {
            assert!(c.submit(s.clone()).await.is_err());
        }
        let batch = pb::SubmitBatchRequest {
            submissions: vec![ok.clone(), invalid[0].clone()],
        };
        c.submit_batch(batch).await.unwrap();
        assert!(
            eventually(Duration::from_secs(10), || async {
                db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
                    .await
                    == 2
            })
            .await
        );
        let log = sidecar.log.clone();
        assert!(sidecar.terminate().await.success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("decision"), "the log was captured at trace level");
        assert!(text.contains("TRACE") || text.contains("\"level\":\"TRACE\""));
        for secret in [&payload, &invalid_payload] {
            for spelling in spellings(secret) {
                assert!(
                    !text.contains(&spelling),
                    "{format} log holds the payload as {spelling:?}: {}",
                    log.display()
                );
            }
        }
        println!("{format}: {} log bytes at trace level, no payload", text.len());
        let _ = std::fs::remove_file(log);
    }
}

// ---- the database role -------------------------------------------------------------

/// With exactly the documented grants, the service works (claims,
/// duplicates, key-reuse rejections, audit, relay, purge) and cannot
/// UPDATE, DELETE or TRUNCATE the ledger or the audit trail, nor drop or
/// alter them, nor rewrite a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_role_cannot_change_or_remove_the_ledger_or_audit_trail() {
    let db = TestDb::new(Kind::Postgres).await;
    let role = unique("og_app_sec_");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    for grant in documented_grants(&role) {
        db.try_exec(&grant)
            .await
            .unwrap_or_else(|e| panic!("{grant}: {e}"));
    }
    let role_url = format!("postgres://{role}@{}/{}", pg_addr(), db.name);

    let mut args = serve_args(&db);
    args.store.database_url = Some(role_url.clone());
    args.migrate_on_start = false;
    args.relay.broker.relay_sink = oncegate::broker::SinkSpec::parse("log").unwrap();
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    let first = submission("AWD-ROLE", TS, b"one", 500);
    assert_eq!(
        outcome(&c.submit(first.clone()).await.unwrap().into_inner()),
        Outcome::Claimed
    );
    assert_eq!(
        outcome(&c.submit(first).await.unwrap().into_inner()),
        Outcome::Duplicate
    );
    let mut reused = submission("AWD-ROLE", TS, b"two", 250);
    reused.idempotency_key = Some("role-key".into());
    c.submit(reused.clone()).await.unwrap();
    reused.amount_cents = 1;
    assert_eq!(
        c.submit(reused).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            let n = db.counts().await;
            n.audit_duplicate == 1 && n.audit_rejected >= 1
        })
        .await,
        "audit rows written by the role: {:?}",
        db.counts().await
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                .await
                == 0
        })
        .await,
        "the relay marks events published as the role"
    );
    let purge = open_store(&role_url, 1)
        .await
        .unwrap()
        .purge(&oncegate::store::RetentionPolicy {
            retention: Duration::from_secs(3 * 365 * 24 * 3600),
            outbox_retention: Duration::from_secs(7 * 24 * 3600),
            batch_size: 100,
        })
        .await;
    assert!(purge.is_ok(), "the retention purge runs as the role: {purge:?}");
    app.shutdown().await;
    let before = db.counts().await;
    assert_eq!(before.ledger(), (2, 2, 750, 2));

    let forbidden = [
        "UPDATE disbursements SET amount_cents = amount_cents + 1",
        "DELETE FROM disbursements",
        "TRUNCATE disbursements",
        "UPDATE audit_log SET detail = 'edited'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
        "DELETE FROM audit_log_default",
        "UPDATE processed_messages SET fingerprint = 'forged'",
        "ALTER TABLE disbursements DISABLE TRIGGER disbursements_append_only",
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
        "DROP TABLE disbursements",
        "DROP TABLE audit_log",
        "DROP TRIGGER disbursements_append_only ON disbursements",
        "CREATE TABLE shadow_ledger (id int)",
    ];
    for sql in forbidden {
        assert_eq!(
            run_as(&role_url, sql).await.map_err(|(code, _)| code),
            Err("42501".into()),
            "{sql} as the service role"
        );
    }
    // The purge function deletes only rows past retention, whatever is asked.
    assert!(
        run_as(
            &role_url,
            "SELECT oncegate_purge_audit_rows(now() - interval '1 year', 1000)"
        )
        .await
        .is_ok()
    );
    // Even the owner (a superuser here) is stopped by the append-only triggers.
    for sql in [
        "UPDATE disbursements SET amount_cents = amount_cents + 1",
        "DELETE FROM disbursements",
        "UPDATE audit_log SET detail = 'edited'",
    ] {
        assert_eq!(
            run_as(&db.url, sql).await.map_err(|(code, _)| code),
            Err("42501".into()),
            "{sql} as the owner"
        );
    }
    let after = db.counts().await;
    assert_eq!(after, before, "nothing changed");

    db.exec(&format!("DROP OWNED BY {role}")).await;
    db.exec(&format!("DROP ROLE {role}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_certificate_fails_start_up_before_the_store_or_any_port() {
    let pki = Pki::new();
    pki.write(
        "server.pem",
        "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n",
    );
    let db = TestDb::new(Kind::Postgres).await;
    let mut args = pki.serve_args(&db, false);
    // An unreachable store: if TLS were read after it, start-up would wait
    // out the store's timeout and fail on the store instead.
    args.store.database_url = Some("postgres://root@127.0.0.1:1/none".into());
    let started = std::time::Instant::now();
    let err = match oncegate::App::build(args.app_config().unwrap()).await {
        Ok(_) => panic!("a bad certificate must fail start-up"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("ONCEGATE_TLS_CERT"), "names the setting: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "before waiting for the store"
    );
}

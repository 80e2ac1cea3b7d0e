//! Start-up and shutdown. [`App::build`] opens the store, connects the tiers
//! and the relay sink, reads the TLS files and binds every listener — any
//! failure happens before anything is served. [`App::run_until_shutdown`]
//! serves until the signal (or until a background task ends, which is a
//! failure), then drains in the phases of [`crate::shutdown`]. Tests boot
//! the real server on port 0 the same way production does.

use crate::audit::{AuditFlusher, AuditQueue, AuditSettings};
use crate::broker::SinkSettings;
use crate::cache::{CacheSettings, LocalCache};
use crate::effects::{EffectCache, Effects, EffectsSettings};
use crate::error::{ConfigError, StoreError};
use crate::gate::Gate;
use crate::group_commit::{Committer, GroupCommitSettings};
use crate::pb;
use crate::reconcile::{ReconcileSettings, Reconciler};
use crate::redis_tier::{RedisSettings, RedisTier};
use crate::relay::{Relay, RelaySettings};
use crate::retention::Retention;
use crate::seal::{SealSchedule, Sealer};
use crate::secret::mask_url;
use crate::server::GateService;
use crate::server::effects::EffectsService;
use crate::shutdown::{Phase, Shutdown, Stop, Tasks, unexpected_exit};
use crate::store::{self, AdminStore, ClaimContext, EffectStore, RetentionPolicy, Store, StoreSettings};
use crate::submission::Limits;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::server::HealthReporter;

/// Everything `serve` runs with; built and checked by `config`.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// Written to audit rows and relay leases.
    pub instance: Arc<str>,
    pub store: StoreSettings,
    pub migrate_on_start: bool,
    /// Refuse to start when the database role is privileged.
    pub require_least_privilege: bool,
    /// Accept claims only while commits wait for a synchronous standby
    /// (also in `store`, which checks every claim transaction).
    pub require_sync_replica: bool,
    /// How long start-up waits for the store to become reachable.
    pub startup_timeout: Duration,
    /// The primary's identity probe (DESIGN §7.2).
    pub primary_probe: ProbeSettings,
    pub listen: SocketAddr,
    pub health_listen: Option<SocketAddr>,
    pub metrics_listen: SocketAddr,
    pub tls: Option<TlsFiles>,
    /// Bound on the drain.
    pub shutdown_grace: Duration,
    pub cache: CacheSettings,
    pub redis: Option<RedisSettings>,
    pub group_commit: GroupCommitSettings,
    pub audit: AuditSettings,
    pub sink: SinkSettings,
    pub relay: RelaySettings,
    pub retention: RetentionPolicy,
    /// How often the purge runs; zero: never.
    pub purge_interval: Duration,
    pub reconcile: ReconcileSettings,
    /// How often reconcile runs; zero: never.
    pub reconcile_interval: Duration,
    /// When the audit trail is sealed and verified.
    pub seal: SealSchedule,
    pub limits: Limits,
    pub server: ServerLimits,
    pub effects: EffectsSettings,
}

/// How the primary's identity (and, when required, its synchronous
/// standbys) is probed: every `interval`, failed when unanswered after
/// `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSettings {
    pub interval: Duration,
    pub timeout: Duration,
}

impl ProbeSettings {
    /// The longest L1/L2 answer for a primary that vanished without a
    /// reset: a confirmation lets caches answer this long after its read
    /// was sent ([`crate::primary`], the cache window).
    pub fn cache_window(&self) -> Duration {
        self.interval + self.timeout
    }
}

/// PEM files for TLS on the gRPC listener; a client CA makes it mTLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// Admission limits of the gRPC service.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_in_flight: usize,
    pub max_batch_items: usize,
    pub max_message_bytes: usize,
}

pub struct App {
    config: AppConfig,
    store: Arc<dyn Store>,
    gate: Arc<Gate>,
    effects: Arc<Effects>,
    redis: Option<Arc<RedisTier>>,
    workers: JoinSet<()>,
    flusher: AuditFlusher,
    relay: Option<Relay>,
    tls: Option<ServerTlsConfig>,
    grpc: TcpListener,
    health: Option<TcpListener>,
    metrics: TcpListener,
}

/// Waits for the store (it may be starting too), then migrates or pings it.
async fn prepare_store(store: &dyn AdminStore, migrate: bool, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(200);
    loop {
        let result = if migrate {
            store.migrate().await
        } else {
            store.ping().await
        };
        match result {
            Ok(()) => return Ok(()),
            Err(StoreError::Unavailable(e)) if tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "store not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(e).context(if migrate {
                    "migrating the store"
                } else {
                    "reaching the store"
                });
            }
        }
    }
}

/// Says at start whether the database role is privileged (log line and
/// `oncegate_db_role_privileged`); with `require`, a privileged role is a
/// configuration error (exit 64).
async fn check_privileges(store: &dyn AdminStore, require: bool) -> anyhow::Result<()> {
    let Some(excess) = store
        .privilege_excess()
        .await
        .context("checking the database role's privileges")?
    else {
        tracing::info!("the embedded store has no database roles; least privilege does not apply");
        return Ok(());
    };
    metrics::gauge!("oncegate_db_role_privileged").set(if excess.is_empty() { 0.0 } else { 1.0 });
    if excess.is_empty() {
        tracing::info!("database role has least privilege");
        return Ok(());
    }
    let excess = excess.join(", ");
    if require {
        return Err(ConfigError(format!(
            "ONCEGATE_REQUIRE_LEAST_PRIVILEGE is set but the database role is privileged ({excess}); \
             connect as the application role (see migrations/GRANTS.md)"
        ))
        .into());
    }
    tracing::warn!(privileges = %excess, "database role is privileged: it could change the ledger or the audit trail");
    Ok(())
}

/// Reads the primary's synchronous replication at start (log line and
/// `oncegate_db_sync_replica`). With `require`, the reading sets the guard:
/// short of a synchronous standby, `serve` starts with claims refused and
/// the Gate NOT_SERVING, and resumes by itself when the standby is there
/// (`crate::primary::guard`); only a database without the guard's function
/// (migration 0014 not applied) is a configuration error (exit 64).
async fn check_replication(store: &dyn AdminStore, require: bool) -> anyhow::Result<()> {
    let r = match store.replication().await {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()),
        Err(e) if require => {
            return Err(ConfigError(format!(
                "ONCEGATE_REQUIRE_SYNC_REPLICA is set but the primary's synchronous standbys cannot be \
                 read ({e}); apply the migrations (oncegate migrate: oncegate_sync_standbys())"
            ))
            .into());
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the primary's replication settings");
            return Ok(());
        }
    };
    let streaming = r
        .streaming
        .map_or_else(|| "unknown".to_string(), |n| n.to_string());
    let commit = r.commit.as_ref().map_or("unknown", |c| c.value.as_str());
    let Some(short) = r.shortfall() else {
        metrics::gauge!("oncegate_db_sync_replica").set(1.0);
        store.primary().guard().observe(&r);
        tracing::info!(
            synchronous_standby_names = %r.standby_names,
            synchronous_commit = commit,
            sync_standbys_streaming = %streaming,
            "commits wait for a synchronous standby"
        );
        return Ok(());
    };
    metrics::gauge!("oncegate_db_sync_replica").set(0.0);
    if require {
        store.primary().guard().observe(&r);
        tracing::warn!(
            why = %short,
            "ONCEGATE_REQUIRE_SYNC_REPLICA: starting with claims refused until a synchronous standby confirms commits"
        );
        return Ok(());
    }
    tracing::warn!(
        synchronous_standby_names = %r.standby_names,
        synchronous_commit = commit,
        why = %short,
        "commits are not waiting for a synchronous standby: a failover can lose acknowledged claims"
    );
    Ok(())
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {what} on {addr}"))
}

/// Reads and checks the PEM files (a bad certificate fails here, before
/// any port is bound).
fn load_tls(files: &TlsFiles) -> anyhow::Result<ServerTlsConfig> {
    let read =
        |p: &PathBuf, what: &str| std::fs::read(p).with_context(|| format!("reading {what} {}", p.display()));
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
        read(&files.cert, "ONCEGATE_TLS_CERT")?,
        read(&files.key, "ONCEGATE_TLS_KEY")?,
    ));
    if let Some(ca) = &files.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca, "ONCEGATE_TLS_CLIENT_CA")?));
    }
    Server::builder()
        .tls_config(tls.clone())
        .context("ONCEGATE_TLS_CERT / ONCEGATE_TLS_KEY: not a usable certificate and key")?;
    Ok(tls)
}

/// The effects service's tiers (DESIGN §9): its own L1, the shared L2.
fn effects(
    config: &AppConfig,
    store: Arc<dyn EffectStore>,
    redis: Option<Arc<RedisTier>>,
    audit: AuditQueue,
) -> Effects {
    Effects::new(
        store,
        EffectCache::new(config.effects.l1_capacity_bytes),
        redis,
        audit,
        config.effects.clone(),
        config.instance.clone(),
    )
}

impl App {
    /// Opens the store, connects the tiers and the relay sink, reads the TLS
    /// files and binds every listener. Fails (with context) before anything
    /// is served.
    pub async fn build(config: AppConfig) -> anyhow::Result<Self> {
        crate::metrics::handle();
        let tls = config.tls.as_ref().map(load_tls).transpose()?;
        let store = store::open(&config.store).await.context("opening the store")?;
        prepare_store(&*store, config.migrate_on_start, config.startup_timeout).await?;
        check_privileges(&*store, config.require_least_privilege).await?;
        check_replication(&*store, config.require_sync_replica).await?;
        crate::retention::check_floor(&*store, &config.retention).await?;
        let redis = match &config.redis {
            Some(settings) => Some(Arc::new(
                RedisTier::connect(settings.clone(), config.instance.clone())
                    .await
                    .context("configuring REDIS_URL")?,
            )),
            None => None,
        };
        let relay = Relay::connect(&config.sink, config.relay.clone(), store.clone()).await?;
        let ctx = ClaimContext {
            instance: config.instance.clone(),
        };
        let group_commit = config.group_commit.fit(store.backend(), config.store.pool_size);
        let (committer, workers) = Committer::start(store.clone(), ctx, group_commit);
        let (audit, flusher) = audit_queue(&config.audit, store.clone())?;
        let l1 = LocalCache::new(config.cache.capacity_bytes, config.cache.ttl);
        let effects = effects(&config, store.clone(), redis.clone(), audit.clone());
        let gate = Gate::new(
            store.clone(),
            l1,
            redis.clone(),
            committer,
            audit,
            config.limits,
            config.instance.clone(),
        );
        let grpc = bind(config.listen, "ONCEGATE_LISTEN").await?;
        let health = match config.health_listen {
            Some(a) => Some(bind(a, "ONCEGATE_HEALTH_LISTEN").await?),
            None => None,
        };
        let metrics = bind(config.metrics_listen, "ONCEGATE_METRICS_LISTEN").await?;
        Ok(Self {
            config,
            store,
            gate: Arc::new(gate),
            effects: Arc::new(effects),
            redis,
            workers,
            flusher,
            relay,
            tls,
            grpc,
            health,
            metrics,
        })
    }

    /// The bound gRPC address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("bound listener has an address")
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics.local_addr().expect("bound listener has an address")
    }

    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// One line for the operator: where it listens, which store, which tiers.
    pub fn banner(&self) -> String {
        let backend = self.store.backend().as_str();
        format!(
            "oncegate listening on {} (gRPC{}), metrics on http://{}/metrics; store: {backend} ({}); tiers: L1 moka{} → {backend}",
            self.local_addr(),
            if self.tls.is_some() { ", TLS" } else { "" },
            self.metrics_addr(),
            mask_url(&self.config.store.url),
            if self.redis.is_some() { " → L2 redis" } else { "" },
        )
    }

    /// Serves until `signal` resolves, then drains within the grace period:
    /// stop accepting → finish in-flight transactions → stop the relay and
    /// purge → flush the audit queue. A background task or the server ending
    /// on its own ends the process with an error naming it.
    pub async fn run_until_shutdown(self, signal: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let shutdown = Shutdown::new();
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let health = Arc::new(Health::new(health_reporter));
        health.set("", true).await;
        let mut tasks = Tasks::new();
        spawn_gate_health(&mut tasks, &shutdown, health.clone(), &*self.store);
        spawn_background(
            &mut tasks,
            &shutdown,
            &self.config,
            self.store.clone(),
            self.flusher,
            self.relay,
        );
        spawn_endpoints(
            &mut tasks,
            &shutdown,
            self.metrics,
            self.health,
            health_service.clone(),
        );
        let effects = self.effects.clone();
        let grpc = grpc_server(
            self.gate,
            self.effects,
            &self.config.server,
            self.tls,
            self.grpc,
            health_service,
            shutdown.stop_at(Phase::StopAccepting),
        )?;
        let mut server = tokio::spawn(grpc);
        let failure = tokio::select! {
            _ = signal => {
                tracing::info!("shutdown signal received; draining");
                None
            }
            ended = &mut server => Some(anyhow::anyhow!("gRPC server ended on its own: {ended:?}")),
            exit = tasks.next_exit() => Some(unexpected_exit(exit)),
        };
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        health.drain().await;
        // Begins waiting on another holder's lease would hold the drain up to
        // the grace; they end now (UNAVAILABLE: retry elsewhere).
        effects.stop_waiting();
        drain(&shutdown, server, self.workers, deadline).await;
        shutdown.advance(Phase::Stopped);
        tasks
            .join_all(deadline.max(tokio::time::Instant::now() + Duration::from_secs(5)))
            .await;
        if let Some(redis) = self.redis {
            redis.quit().await;
        }
        tracing::info!("oncegate stopped");
        failure.map_or(Ok(()), Err)
    }
}

/// The first three phases: stop accepting and finish the calls in flight,
/// let the group-commit workers finish the queued transactions, then stop
/// the background work and flush the audit queue (joined by the caller).
async fn drain(
    shutdown: &Shutdown,
    mut server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    mut workers: JoinSet<()>,
    deadline: tokio::time::Instant,
) {
    shutdown.advance(Phase::StopAccepting);
    if tokio::time::timeout_at(deadline, &mut server).await.is_err() {
        tracing::warn!("in-flight requests outlived the shutdown grace; abandoning them");
        server.abort();
    }
    // The server (and with it the gate's last queue sender) is gone: the
    // workers finish the queued transactions and end.
    let finished = tokio::time::timeout_at(deadline, async { while workers.join_next().await.is_some() {} });
    if finished.await.is_err() {
        tracing::warn!("claim transactions outlived the shutdown grace");
    }
    shutdown.advance(Phase::StopBackground);
    shutdown.advance(Phase::FlushAudit);
}

/// The audit flusher and sealer, the relay, the purge, reconciliation and
/// the gauges, each ending at its phase.
fn spawn_background(
    tasks: &mut Tasks,
    shutdown: &Shutdown,
    config: &AppConfig,
    store: Arc<dyn Store>,
    flusher: AuditFlusher,
    relay: Option<Relay>,
) {
    spawn_audit(tasks, shutdown, &config.seal, store.clone(), flusher);
    if let Some(relay) = relay {
        let stop = shutdown.stop_at(Phase::StopBackground);
        tasks.spawn("outbox relay", async move {
            relay.run(stop).await;
            Ok(())
        });
        let (stop, store) = (shutdown.stop_at(Phase::StopBackground), store.clone());
        tasks.spawn("outbox gauges", async move {
            crate::relay::report_outbox_gauges(&*store, OUTBOX_GAUGE_INTERVAL, stop).await;
            Ok(())
        });
    }
    if !config.purge_interval.is_zero() {
        let retention = Retention::new(store.clone(), config.retention.clone());
        let (stop, interval) = (shutdown.stop_at(Phase::StopBackground), config.purge_interval);
        tasks.spawn("retention purge", async move {
            retention.run(interval, stop).await;
            Ok(())
        });
    }
    if !config.reconcile_interval.is_zero() {
        let reconciler = Reconciler::new(store.clone(), config.reconcile.clone());
        let (stop, interval) = (shutdown.stop_at(Phase::StopBackground), config.reconcile_interval);
        tasks.spawn("reconciliation", async move {
            reconciler.run_every(interval, stop).await;
            Ok(())
        });
    }
    if store.backend() == crate::store::Backend::Postgres {
        let (stop, probe_store) = (shutdown.stop_at(Phase::StopBackground), store.clone());
        let probe = config.primary_probe;
        tasks.spawn("primary probe", async move {
            probe_primary(&*probe_store, probe, stop).await;
            Ok(())
        });
    }
    let stop = shutdown.stop_at(Phase::StopBackground);
    tasks.spawn("gauges", async move {
        report_gauges(&*store, stop).await;
        Ok(())
    });
}

/// The audit flusher; the sealer, which seals a last time once the flusher
/// has written out the queue; and the periodic verification.
fn spawn_audit(
    tasks: &mut Tasks,
    shutdown: &Shutdown,
    seal: &SealSchedule,
    store: Arc<dyn Store>,
    flusher: AuditFlusher,
) {
    let (flushed, flushed_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = shutdown.stop_at(Phase::FlushAudit);
    tasks.spawn("audit flusher", async move {
        flusher.run(stop).await;
        let _ = flushed.send(());
        Ok(())
    });
    if !seal.interval.is_zero() {
        let sealer = Sealer::new(store.clone(), seal.settings.clone());
        let (stop, interval) = (shutdown.stop_at(Phase::FlushAudit), seal.interval);
        tasks.spawn("audit sealer", async move {
            sealer
                .run(interval, stop, async move {
                    let _ = flushed_rx.await;
                })
                .await;
            Ok(())
        });
    }
    if !seal.verify_interval.is_zero() {
        let (stop, interval) = (shutdown.stop_at(Phase::StopBackground), seal.verify_interval);
        tasks.spawn("audit verifier", async move {
            crate::seal::run_verifier(store, interval, stop).await;
            Ok(())
        });
    }
}

/// `/metrics` (open until the very end) and the health-only listener
/// (closed with the gRPC listener).
fn spawn_endpoints(
    tasks: &mut Tasks,
    shutdown: &Shutdown,
    metrics: TcpListener,
    health: Option<TcpListener>,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) {
    let stop = shutdown.stop_at(Phase::Stopped).into_future();
    tasks.spawn("metrics endpoint", async move {
        crate::metrics::serve(metrics, stop)
            .await
            .context("serving /metrics")
    });
    if let Some(listener) = health {
        let stop = shutdown.stop_at(Phase::StopAccepting).into_future();
        tasks.spawn("health endpoint", async move {
            Server::builder()
                .add_service(health_service)
                .serve_with_incoming_shutdown(incoming(listener), stop)
                .await
                .context("serving ONCEGATE_HEALTH_LISTEN")
        });
    }
}

/// The gRPC server: Gate, Effects, health and reflection, until `stop`.
fn grpc_server(
    gate: Arc<Gate>,
    effects: Arc<Effects>,
    limits: &ServerLimits,
    tls: Option<ServerTlsConfig>,
    listener: TcpListener,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    stop: Stop,
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let service = pb::gate_server::GateServer::new(GateService::new(
        gate,
        limits.max_in_flight,
        limits.max_batch_items,
    ))
    .max_decoding_message_size(limits.max_message_bytes);
    let effects = pb::effects_server::EffectsServer::new(EffectsService::new(effects, limits.max_in_flight))
        .max_decoding_message_size(limits.max_message_bytes);
    let mut builder = Server::builder().layer(tower::util::MapResponseLayer::new(
        size_limit_is_resource_exhausted as fn(_) -> _,
    ));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).context("configuring TLS")?;
    }
    Ok(builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .add_service(effects)
        .serve_with_incoming_shutdown(incoming(listener), stop.into_future()))
}

/// Accepted connections with `TCP_NODELAY`, as tonic's own listener sets
/// it: with Nagle's algorithm on, a response written while the previous one
/// is unacknowledged waits for the peer's delayed ACK (~40 ms on Linux);
/// measured at 64 clients, about 1 % of fresh claims took 40 ms more.
pub fn incoming(listener: tokio::net::TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// tonic refuses a request over the decoding limit with `OUT_OF_RANGE`; the
/// contract (DESIGN §1) answers every size limit with `RESOURCE_EXHAUSTED`.
/// Decode errors are trailers-only responses, so the status is in the headers.
fn size_limit_is_resource_exhausted(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers_mut();
    let over_limit = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.contains("too%20large") || m.contains("too large"));
    if over_limit {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from(tonic::Code::ResourceExhausted as i32),
        );
    }
    response
}

/// The gRPC health statuses: "" (the process) serving until the drain;
/// the Gate and Effects services serving while the synchronous-standby
/// guard accepts claims (always, when it is not required), so a readiness
/// probe on `oncegate.v1.Gate` takes a pod without a standby out of its
/// Service while its liveness (on "") stays up.
struct Health {
    reporter: HealthReporter,
    /// Set by the drain: nothing is reported serving after it.
    draining: tokio::sync::Mutex<bool>,
}

impl Health {
    fn new(reporter: HealthReporter) -> Self {
        Self {
            reporter,
            draining: tokio::sync::Mutex::new(false),
        }
    }

    /// Sets `service` ("" or "gate", which covers Gate and Effects) unless
    /// the drain has begun.
    async fn set(&self, service: &str, serving: bool) {
        let draining = self.draining.lock().await;
        if !*draining {
            self.report(service, serving).await;
        }
    }

    async fn report(&self, service: &str, serving: bool) {
        type GateSvc = pb::gate_server::GateServer<GateService>;
        type EffectsSvc = pb::effects_server::EffectsServer<EffectsService>;
        let r = &self.reporter;
        match (service, serving) {
            ("", true) => {
                r.set_service_status("", tonic_health::ServingStatus::Serving)
                    .await
            }
            ("", false) => {
                r.set_service_status("", tonic_health::ServingStatus::NotServing)
                    .await
            }
            (_, true) => {
                r.set_serving::<GateSvc>().await;
                r.set_serving::<EffectsSvc>().await;
            }
            (_, false) => {
                r.set_not_serving::<GateSvc>().await;
                r.set_not_serving::<EffectsSvc>().await;
            }
        }
    }

    /// Everything NOT_SERVING, for good.
    async fn drain(&self) {
        let mut draining = self.draining.lock().await;
        *draining = true;
        self.report("", false).await;
        self.report("gate", false).await;
    }
}

/// The Gate's (and Effects') health follows the synchronous-standby guard
/// and the store's refusals (a grant missing, read-only) until the drain.
fn spawn_gate_health(tasks: &mut Tasks, shutdown: &Shutdown, health: Arc<Health>, store: &dyn Store) {
    // The watch is held here: an embedded store hands out a new one per call.
    let primary = store.primary();
    let mut guarded = primary.guard().serving();
    let mut taking = primary.taking_claims();
    let mut stop = shutdown.stop_at(Phase::StopAccepting);
    tasks.spawn("gate health", async move {
        let _primary = primary;
        loop {
            let now = *guarded.borrow_and_update() && *taking.borrow_and_update();
            health.set("gate", now).await;
            let closed = tokio::select! {
                _ = stop.requested() => return Ok(()),
                changed = guarded.changed() => changed.is_err(),
                changed = taking.changed() => changed.is_err(),
            };
            if closed {
                stop.requested().await;
                return Ok(());
            }
        }
    });
}

/// Re-reads the primary's identity (and, when required, its synchronous
/// standbys) every interval on a connection of its own, timing each read,
/// and at once when a store call lost its connection: a failure, or no
/// answer within the timeout, suspends cache answers until a connection
/// confirms the identity again (DESIGN §7.2). Caches answer at most
/// interval + timeout after the last confirmation was sent, whatever
/// becomes of this task. Postgres only: the embedded store has no server to
/// fail over.
async fn probe_primary(store: &dyn Store, probe: ProbeSettings, mut stop: Stop) {
    let primary = store.primary();
    primary.set_confirmation_lease(probe.cache_window());
    let mut tick = tokio::time::interval(probe.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Probes asked for by a lost connection come at most this often.
    let gap = (probe.interval / 10).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = stop.requested() => return,
            _ = tick.tick() => {}
            _ = async { tokio::time::sleep(gap).await; primary.probe_requested().await } => {}
        }
        let started = tokio::time::Instant::now();
        match store.probe_primary(probe.timeout).await {
            Ok(()) => metrics::histogram!("oncegate_store_identity_probe_seconds")
                .record(started.elapsed().as_secs_f64()),
            Err(e) => {
                metrics::counter!("oncegate_store_identity_probe_failures_total").increment(1);
                tracing::debug!(error = %e, "identity probe failed");
                primary.suspend("the primary's identity probe failed");
            }
        }
    }
}

/// Pool and outbox gauges, every few seconds.
/// How often the outbox gauges are read from the store.
const OUTBOX_GAUGE_INTERVAL: Duration = Duration::from_secs(2);

async fn report_gauges(store: &dyn Store, mut stop: Stop) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = stop.requested() => {
                crate::log_fold::flush_now();
                return;
            }
            _ = tick.tick() => {
                crate::log_fold::flush();
                if let Some(held) = store.connections_held() {
                    metrics::gauge!("oncegate_db_connections_held").set(f64::from(held));
                }
                if let Some((size, idle)) = store.pool_usage() {
                    metrics::gauge!("oncegate_db_pool_connections", "state" => "idle").set(idle as f64);
                    metrics::gauge!("oncegate_db_pool_connections", "state" => "used").set((size as usize).saturating_sub(idle) as f64);
                }
            }
        }
    }
}

/// The audit queue and its flusher, with the spool (and the rows it held)
/// when `ONCEGATE_AUDIT_SPOOL_DIR` is set.
fn audit_queue(
    settings: &AuditSettings,
    store: Arc<dyn Store>,
) -> anyhow::Result<(AuditQueue, AuditFlusher)> {
    let spool = match &settings.spool_dir {
        Some(dir) => Some(
            crate::audit::spool::Spool::open(dir)
                .map_err(anyhow::Error::msg)
                .context("opening ONCEGATE_AUDIT_SPOOL_DIR")?,
        ),
        None => None,
    };
    Ok(AuditQueue::spooled(
        settings.queue,
        store,
        settings.batch,
        settings.flush_interval,
        spool,
    ))
}

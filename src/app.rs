//! Start-up and shutdown: `App::build` parses nothing and binds everything;
//! `run_until_shutdown` serves until the signal, then drains in order:
//! stop accepting → finish in-flight requests and their transactions → stop
//! the relay and purge → flush the audit queue → exit. Tests boot the real
//! server on port 0 the same way production does.

use crate::audit::{AuditFlusher, AuditQueue};
use crate::cache::LocalCache;
use crate::config::{ServeArgs, hostname};
use crate::error::StoreError;
use crate::gate::Gate;
use crate::group_commit::{Committer, GroupCommitSettings};
use crate::pb;
use crate::redis_tier::{RedisSettings, RedisTier};
use crate::relay::Relay;
use crate::retention::Retention;
use crate::server::GateService;
use crate::store::{self, ClaimContext, Store};
use crate::submission::Limits;
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::server::HealthReporter;

pub struct App {
    args: ServeArgs,
    store: Arc<dyn Store>,
    gate: Arc<Gate>,
    redis: Option<Arc<RedisTier>>,
    workers: JoinSet<()>,
    flusher: AuditFlusher,
    relay: Option<Relay>,
    grpc: TcpListener,
    health: Option<TcpListener>,
    metrics: TcpListener,
}

/// Waits for the store (it may be starting too), then migrates or pings it.
async fn prepare_store(store: &dyn Store, migrate: bool, timeout: Duration) -> anyhow::Result<()> {
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

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {what} on {addr}"))
}

impl App {
    /// Opens the store, connects the tiers and the relay sink, and binds
    /// every listener. Fails (with context) before anything is served.
    pub async fn build(args: ServeArgs) -> anyhow::Result<Self> {
        crate::metrics::handle();
        let instance: Arc<str> = args.instance_id.clone().unwrap_or_else(hostname).into();
        let store = store::open(&args.store.url(), args.store.db_pool_size)
            .await
            .context("opening the store")?;
        prepare_store(&*store, args.migrate_on_start, args.startup_timeout).await?;

        let redis = match &args.redis_url {
            Some(url) if !url.is_empty() => Some(Arc::new(
                RedisTier::connect(
                    RedisSettings {
                        url: url.clone(),
                        key_prefix: args.redis_key_prefix.clone(),
                        timeout: args.redis_timeout,
                        lease_ttl: args.redis_lease_ttl,
                        dedup_ttl: args.redis_dedup_ttl,
                        breaker_threshold: args.redis_breaker_threshold,
                        breaker_cooldown: args.redis_breaker_cooldown,
                    },
                    instance.clone(),
                )
                .await
                .context("configuring REDIS_URL")?,
            )),
            _ => None,
        };
        let relay = Relay::from_config(&args.relay, store.clone(), instance.to_string()).await?;

        let (committer, workers) = Committer::start(
            store.clone(),
            ClaimContext {
                instance: instance.clone(),
            },
            GroupCommitSettings {
                max_batch: args.group_commit_max_batch,
                max_wait: args.group_commit_max_wait,
                workers: args.group_commit_workers,
            },
        );
        let (audit, flusher) =
            AuditQueue::new(args.audit_queue, store.clone(), 500, args.audit_flush_interval);
        let gate = Arc::new(Gate::new(
            store.clone(),
            LocalCache::new(args.l1_capacity_bytes, args.l1_ttl),
            redis.clone(),
            committer,
            audit,
            Limits {
                max_payload_bytes: args.max_payload_bytes,
            },
            instance,
        ));

        let grpc = bind(args.listen, "ONCEGATE_LISTEN").await?;
        let health = match args.health_listen {
            Some(a) => Some(bind(a, "ONCEGATE_HEALTH_LISTEN").await?),
            None => None,
        };
        let metrics = bind(args.metrics_listen, "ONCEGATE_METRICS_LISTEN").await?;
        Ok(Self {
            args,
            store,
            gate,
            redis,
            workers,
            flusher,
            relay,
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
        format!(
            "oncegate listening on {} (gRPC{}), metrics on http://{}/metrics; store: {} ({}); tiers: L1 moka{}{}",
            self.local_addr(),
            if self.args.tls.tls_cert.is_some() {
                ", TLS"
            } else {
                ""
            },
            self.metrics_addr(),
            self.store.backend().as_str(),
            crate::config::mask_url(&self.args.store.url()),
            if self.redis.is_some() { " → L2 redis" } else { "" },
            format_args!(" → {}", self.store.backend().as_str()),
        )
    }

    fn tls(&self) -> anyhow::Result<Option<ServerTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.args.tls.tls_cert, &self.args.tls.tls_key) else {
            return Ok(None);
        };
        let read = |p: &std::path::PathBuf, what: &str| {
            std::fs::read(p).with_context(|| format!("reading {what} {}", p.display()))
        };
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            read(cert, "ONCEGATE_TLS_CERT")?,
            read(key, "ONCEGATE_TLS_KEY")?,
        ));
        if let Some(ca) = &self.args.tls.tls_client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca, "ONCEGATE_TLS_CLIENT_CA")?));
        }
        Ok(Some(tls))
    }

    /// Serves until `signal` resolves, then drains within the grace period.
    pub async fn run_until_shutdown(self, signal: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let tls = self.tls()?;
        let Self {
            args,
            store,
            gate,
            redis,
            mut workers,
            flusher,
            relay,
            grpc,
            health,
            metrics,
        } = self;
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        set_serving(&health_reporter, true).await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        let (stop_tx, stop_rx) = watch::channel(false);
        let (flush_tx, flush_rx) = watch::channel(false);
        let mut background: JoinSet<&'static str> = JoinSet::new();
        background.spawn(async move {
            flusher.run(flush_rx).await;
            "audit flusher"
        });
        if let Some(relay) = relay {
            let rx = stop_rx.clone();
            background.spawn(async move {
                relay.run(rx).await;
                "outbox relay"
            });
        }
        if !args.retention.purge_interval.is_zero() {
            let retention = Retention::new(store.clone(), args.retention.policy());
            let (rx, interval) = (stop_rx.clone(), args.retention.purge_interval);
            background.spawn(async move {
                retention.run(interval, rx).await;
                "retention purge"
            });
        }
        {
            let rx = stop_rx.clone();
            let store = store.clone();
            background.spawn(async move {
                report_gauges(&*store, rx).await;
                "gauges"
            });
        }
        let mut metrics_rx = flush_tx.subscribe();
        let metrics_server = tokio::spawn(crate::metrics::serve(metrics, async move {
            let _ = metrics_rx.wait_for(|v| *v).await;
        }));
        let health_server = health.map(|listener| {
            let mut rx = stop_rx.clone();
            let svc = health_service.clone();
            tokio::spawn(Server::builder().add_service(svc).serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                async move {
                    let _ = rx.wait_for(|v| *v).await;
                },
            ))
        });

        let service = pb::gate_server::GateServer::new(GateService::new(
            gate,
            args.max_in_flight,
            args.max_batch_items,
        ))
        .max_decoding_message_size(args.max_message_bytes);
        let mut builder = Server::builder().layer(tower::util::MapResponseLayer::new(
            size_limit_is_resource_exhausted as fn(_) -> _,
        ));
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).context("configuring TLS")?;
        }
        let mut grpc_rx = stop_rx.clone();
        let mut server = tokio::spawn(
            builder
                .add_service(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), async move {
                    let _ = grpc_rx.wait_for(|v| *v).await;
                }),
        );

        let mut failure = None;
        tokio::select! {
            _ = signal => tracing::info!("shutdown signal received; draining"),
            ended = &mut server => {
                tracing::error!(?ended, "gRPC server ended on its own");
                failure = Some(anyhow::anyhow!("gRPC server ended: {ended:?}"));
            }
        }
        let deadline = tokio::time::Instant::now() + args.shutdown_grace;
        set_serving(&health_reporter, false).await;
        let _ = stop_tx.send(true);
        if tokio::time::timeout_at(deadline, &mut server).await.is_err() {
            tracing::warn!("in-flight requests outlived the shutdown grace; abandoning them");
            server.abort();
        }
        // The server (and with it the gate's last queue sender) is gone:
        // the group-commit workers finish the queued transactions and end.
        if tokio::time::timeout_at(deadline, async { while workers.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!("claim transactions outlived the shutdown grace");
        }
        let _ = flush_tx.send(true);
        let flush_deadline = deadline.max(tokio::time::Instant::now() + Duration::from_secs(5));
        while let Ok(Some(ended)) = tokio::time::timeout_at(flush_deadline, background.join_next()).await {
            match ended {
                Ok(name) => tracing::info!(task = name, "stopped"),
                Err(e) => tracing::error!(error = %e, "background task failed"),
            }
        }
        if let Some(h) = health_server {
            h.abort();
        }
        let _ = metrics_server.await;
        if let Some(redis) = redis {
            redis.quit().await;
        }
        tracing::info!("oncegate stopped");
        failure.map_or(Ok(()), Err)
    }
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

async fn set_serving(reporter: &HealthReporter, serving: bool) {
    type GateSvc = pb::gate_server::GateServer<GateService>;
    if serving {
        reporter.set_serving::<GateSvc>().await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
    } else {
        reporter.set_not_serving::<GateSvc>().await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }
}

/// Pool and outbox gauges, every few seconds.
async fn report_gauges(store: &dyn Store, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {
                if let Some((size, idle)) = store.pool_usage() {
                    metrics::gauge!("oncegate_db_pool_connections", "state" => "idle").set(idle as f64);
                    metrics::gauge!("oncegate_db_pool_connections", "state" => "used").set((size as usize).saturating_sub(idle) as f64);
                }
            }
        }
    }
}

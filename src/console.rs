//! `oncegate console`: a read-only web console for operators and auditors
//! (docs/CONSOLE.md), served by the same binary on a listener of its own
//! (loopback by default).
//!
//! Pages: find (an award, a key or the prefix the logs print, a
//! disbursement id), a delivery's history, an award, the relay, the sealed
//! trail. Each reads through the store's capabilities (`inspect`'s,
//! `reconcile`'s award checks, `audit verify`'s and `audit export`'s code),
//! each an indexed read (migration 0017). Every page needs the bearer token
//! (`Authorization: Bearer …`, or the same token entered once and kept in a
//! same-site cookie); the database role is checked at start to be able to
//! read only (migrations/GRANTS.md). No page shows a payload (none is
//! stored) or a secret; every response carries the security headers in
//! [`security_headers`]; nothing is fetched from another origin.
//!
//! `console/state` holds what requests share (the token, the trail's last
//! verification); `console/pages` reads and renders each page.

mod pages;
pub mod state;

use crate::error::ConfigError;
use crate::shutdown::{Phase, Shutdown, Tasks};
use crate::store::Store;
use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State as Shared};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use state::{ConsoleSettings, State, TOKEN_COOKIE, Trigger};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The console, bound and ready to serve.
pub struct Console {
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    verify_interval: Duration,
}

impl Console {
    /// Checks the database role (exit 64 through [`ConfigError`] when it can
    /// do more than read and `require_read_only` is set) and binds.
    pub async fn build(settings: ConsoleSettings, store: Arc<dyn Store>) -> anyhow::Result<Self> {
        check_read_only(&*store, settings.require_read_only).await?;
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("binding ONCEGATE_CONSOLE_LISTEN on {}", settings.listen))?;
        Ok(Self {
            listener,
            state: Arc::new(State::new(store, &settings)),
            verify_interval: settings.verify_interval,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `signal`, verifying the trail on schedule meanwhile.
    pub async fn run_until_shutdown(self, signal: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let shutdown = Shutdown::new();
        let mut tasks = Tasks::new();
        let stop = shutdown.stop_at(Phase::Stopped).into_future();
        let app = router(self.state.clone());
        let listener = self.listener;
        tasks.spawn("console listener", async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
                .context("serving the console")
        });
        if !self.verify_interval.is_zero() {
            let (state, every, mut stop) = (
                self.state.clone(),
                self.verify_interval,
                shutdown.stop_at(Phase::StopBackground),
            );
            tasks.spawn("console trail verification", async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.requested() => return Ok(()),
                        _ = tick.tick() => state.verify(Trigger::Scheduled).await,
                    }
                }
            });
        }
        let failure = tokio::select! {
            _ = signal => None,
            exit = tasks.next_exit() => Some(crate::shutdown::unexpected_exit(exit)),
        };
        shutdown.advance(Phase::Stopped);
        tasks
            .join_all(tokio::time::Instant::now() + Duration::from_secs(10))
            .await;
        failure.map_or(Ok(()), Err)
    }
}

/// Refuses a role that can do more than read (when required), naming each
/// excess; logs it either way.
async fn check_read_only(store: &dyn Store, required: bool) -> anyhow::Result<()> {
    let excess = store
        .read_only_excess()
        .await
        .context("reading the console's database privileges")?;
    match excess {
        None if required => Err(ConfigError::new(
            "the console needs Postgres (DATABASE_URL) when ONCEGATE_CONSOLE_REQUIRE_READ_ONLY is true: \
             the embedded SQLite file has no read-only role",
        )
        .into()),
        Some(excess) if !excess.is_empty() => {
            let list = excess.join(", ");
            if required {
                return Err(ConfigError::new(format!(
                    "the console's database role can do more than read ({list}): give it only what \
                     oncegate_grant_console_role grants (migrations/GRANTS.md), or set \
                     ONCEGATE_CONSOLE_REQUIRE_READ_ONLY=false"
                ))
                .into());
            }
            tracing::warn!(excess = %list, "the console's database role can do more than read");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Every route, behind the token (but the login form and the stylesheet)
/// and the security headers.
fn router(state: Arc<State>) -> Router {
    let pages = Router::new()
        .route("/", get(pages::home))
        .route("/find", get(pages::find))
        .route("/delivery", get(pages::delivery))
        .route("/award", get(pages::award))
        .route("/relay", get(pages::relay))
        .route("/trail", get(pages::trail))
        .route("/trail/verify", post(pages::verify))
        .route("/trail/export", get(pages::export))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .merge(pages)
        .route("/login", post(pages::login))
        .route("/console.css", get(stylesheet))
        .fallback(pages::not_found)
        .layer(middleware::map_response(security_headers))
        .with_state(state)
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console/console.css"),
    )
}

/// The token a request offers: the bearer header, else the cookie.
fn offered_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(bearer.trim());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value)
}

async fn require_token(Shared(state): Shared<Arc<State>>, request: Request, next: Next) -> Response {
    let offered = offered_token(request.headers());
    if offered.is_some_and(|t| state.token_matches(t)) {
        return next.run(request).await;
    }
    let wrong = offered.is_some();
    let mut response = (StatusCode::UNAUTHORIZED, pages::unauthorized(wrong)).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"oncegate console\""),
    );
    response
}

/// The headers every response carries: nothing from another origin, no
/// framing, no sniffing, no referrer, nothing cached.
pub async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
        ("permissions-policy", "camera=(), microphone=(), geolocation=()"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

//! `oncegate submit` and `oncegate lookup`: one call to a running sidecar,
//! its answer printed; and [`Target`], the sidecar's address as every
//! command that calls one (`submit`, `lookup`, `effect begin|complete|release`,
//! `bench`) takes it.

use crate::pb;
use crate::pb::gate_client::GateClient;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// How long a call to a sidecar waits for its connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A sidecar's gRPC address: `host:port` (as `serve` prints it and the
/// clients take it), `[v6 address]:port`, or a URL `http://host[:port]` /
/// `https://host[:port]`. Held as the URL it connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target(String);

impl Target {
    /// The URL the connection is made to (always with its scheme).
    pub fn url(&self) -> &str {
        &self.0
    }

    /// A lazily-configured endpoint for this target.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(self.0.clone())
            .expect("checked when parsed")
            .connect_timeout(CONNECT_TIMEOUT)
    }

    /// Connects, naming the target in the error.
    pub async fn connect(&self) -> anyhow::Result<Channel> {
        self.connect_with(self.endpoint()).await
    }

    /// Connects through `endpoint` (this target's, further configured).
    pub async fn connect_with(&self, endpoint: Endpoint) -> anyhow::Result<Channel> {
        endpoint
            .connect()
            .await
            .map_err(|e| Unreachable::new(self, &e).into())
    }

    /// `host:port` as the user gives it and `serve` prints it.
    fn authority(&self) -> &str {
        self.0.split_once("://").map_or(&self.0, |(_, rest)| rest)
    }
}

/// No connection to a sidecar: the target, the cause with each message once
/// (tonic's "transport error" wrapper left out), and, when nothing answered
/// there, what to check.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to the sidecar at {target} (--target): {cause}{hint}")]
pub struct Unreachable {
    target: String,
    cause: String,
    hint: String,
}

impl Unreachable {
    fn new(target: &Target, e: &tonic::transport::Error) -> Self {
        use std::error::Error;
        let chain = || std::iter::successors(e.source(), |c| (*c).source());
        let cause = crate::cli::chain_text(chain());
        let nobody_there = chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| nothing_answers(io.kind()))
        });
        let hint = if nobody_there {
            format!("; is `oncegate serve` running on {}?", target.authority())
        } else {
            String::new()
        };
        Self {
            target: target.to_string(),
            cause: if cause.is_empty() { e.to_string() } else { cause },
            hint,
        }
    }
}

/// An error that says no server took the connection (rather than one that
/// refused it: TLS, a name that does not resolve).
fn nothing_answers(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | TimedOut
            | HostUnreachable
            | NetworkUnreachable
            | AddrNotAvailable
    )
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        if raw.contains('@') {
            // (Checked first and never quoted: it may hold a password.)
            return Err("the address has user information (user@): the sidecar takes none".into());
        }
        let (scheme, authority) = match raw.split_once("://") {
            Some((scheme, rest)) => {
                let scheme = scheme.to_ascii_lowercase();
                if scheme != "http" && scheme != "https" {
                    return Err(format!(
                        "{scheme}:// is not a gRPC address: host:port, http://host:port or https://host:port"
                    ));
                }
                (scheme, rest.strip_suffix('/').unwrap_or(rest))
            }
            None => ("http".to_string(), raw),
        };
        if authority.contains(['/', '?', '#']) {
            return Err(format!(
                "{raw:?} has a path: the sidecar is host:port, nothing after it"
            ));
        }
        check_host_port(authority, scheme == "http" && !raw.contains("://"))
            .map_err(|why| format!("{raw:?}: {why}"))?;
        let url = format!("{scheme}://{authority}");
        Endpoint::from_shared(url.clone()).map_err(|e| format!("{raw:?} is not an address: {e}"))?;
        Ok(Self(url))
    }
}

/// The sidecar a command calls: one definition of `ONCEGATE_TARGET` for
/// every subcommand that takes it.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// The sidecar's address: host:port, or http(s)://host:port (`bench`:
    /// the sidecar, or the echo server, it drives).
    #[arg(long, env = "ONCEGATE_TARGET", default_value = "127.0.0.1:50051", value_parser = TargetParser)]
    pub target: Target,
}

impl std::ops::Deref for TargetArgs {
    type Target = Target;

    fn deref(&self) -> &Target {
        &self.target
    }
}

/// Parses `--target` for clap: the error names the flag and what is wrong,
/// and quotes the value only through [`Target`]'s own message (clap's
/// default would echo a password given in the URL).
#[derive(Debug, Clone, Copy)]
pub struct TargetParser;

impl clap::builder::TypedValueParser for TargetParser {
    type Value = Target;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Target, clap::Error> {
        let flag = arg.map_or_else(|| "--target".to_string(), |a| a.to_string());
        let why = match value.to_str() {
            Some(raw) => match raw.parse() {
                Ok(target) => return Ok(target),
                Err(why) => why,
            },
            None => "not UTF-8".to_string(),
        };
        let message = format!("invalid value for {flag} (or ONCEGATE_TARGET): {why}\n");
        Err(clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd))
    }
}

/// `host:port` (or `[v6]:port`); the port may be left out only after a scheme.
fn check_host_port(authority: &str, port_required: bool) -> Result<(), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address needs its closing ]")?;
        v6.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("[{v6}] is not an IPv6 address"))?;
        match after {
            "" => ("v6", None),
            p => (
                "v6",
                Some(p.strip_prefix(':').ok_or("after [address] comes :port")?),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err("an IPv6 address goes in brackets: [::1]:50051".into());
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!("{host:?} is not a host name"));
    }
    match port {
        Some(p) if p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(()),
        Some(p) => Err(format!("{p:?} is not a port number")),
        None if port_required => Err("no port: host:port, e.g. 127.0.0.1:50051".into()),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[arg(long)]
    pub award_id: String,
    /// RFC 3339 (default: now).
    #[arg(long)]
    pub timestamp: Option<String>,
    #[arg(long)]
    pub amount_cents: i64,
    /// Payload text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Producer-supplied key (instead of the derived one).
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct LookupArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    pub idempotency_key: String,
}

fn print_decision(d: &pb::Decision) -> Result<(), crate::cli::StdoutError> {
    let outcome = pb::Outcome::try_from(d.outcome)
        .map(|o| o.as_str_name())
        .unwrap_or("?");
    let tier = pb::Tier::try_from(d.decided_by)
        .map(|t| t.as_str_name())
        .unwrap_or("?");
    out!("{outcome} by {tier}")?;
    out!("  idempotency_key {}", d.idempotency_key)?;
    if let Some(b) = &d.disbursement {
        out!(
            "  disbursement    {} award={} amount_cents={} sequence={} recorded_at={}",
            b.id,
            b.award_id,
            b.amount_cents,
            b.sequence,
            b.recorded_at
        )?;
    }
    Ok(())
}

/// A call the sidecar answered with an error status: its code and message,
/// once, on stderr; exit 1.
pub fn print_status(s: &tonic::Status) -> ExitCode {
    eprintln!("{:?}: {}", s.code(), s.message());
    ExitCode::from(1)
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => Vec::new(),
    };
    let timestamp = args
        .timestamp
        .unwrap_or_else(|| crate::time_fmt::rfc3339(time::OffsetDateTime::now_utc()));
    let mut client = GateClient::new(args.target.connect().await?);
    let request = pb::Submission {
        award_id: args.award_id,
        submission_timestamp: timestamp,
        payload,
        amount_cents: args.amount_cents,
        idempotency_key: args.idempotency_key,
    };
    match client.submit(request).await {
        Ok(d) => {
            print_decision(d.get_ref())?;
            Ok(ExitCode::SUCCESS)
        }
        Err(s) => Ok(print_status(&s)),
    }
}

pub async fn lookup(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let mut client = GateClient::new(args.target.connect().await?);
    let request = pb::LookupRequest {
        idempotency_key: args.idempotency_key,
    };
    match client.lookup(request).await {
        Ok(r) => match &r.get_ref().decision {
            Some(d) if r.get_ref().found => {
                print_decision(d)?;
                Ok(ExitCode::SUCCESS)
            }
            _ => {
                out!("not found")?;
                Ok(ExitCode::from(1))
            }
        },
        Err(s) => Ok(print_status(&s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Result<String, String> {
        s.parse::<Target>().map(|t| t.url().to_string())
    }

    #[test]
    fn host_port_and_urls_are_targets() {
        for (given, url) in [
            ("127.0.0.1:50151", "http://127.0.0.1:50151"),
            ("localhost:50051", "http://localhost:50051"),
            ("gate.internal:443", "http://gate.internal:443"),
            ("[::1]:50051", "http://[::1]:50051"),
            ("http://127.0.0.1:50051", "http://127.0.0.1:50051"),
            ("http://127.0.0.1:50051/", "http://127.0.0.1:50051"),
            ("HTTPS://gate.example:8443", "https://gate.example:8443"),
            ("https://gate.example", "https://gate.example"),
            ("http://[::1]:50051", "http://[::1]:50051"),
        ] {
            assert_eq!(target(given).as_deref(), Ok(url), "{given}");
        }
    }

    #[test]
    fn a_bad_target_says_what_is_wrong() {
        for (given, says) in [
            ("", "no host"),
            ("127.0.0.1", "no port"),
            ("localhost", "no port"),
            (":50051", "no host"),
            ("127.0.0.1:0", "not a port number"),
            ("127.0.0.1:http", "not a port number"),
            ("127.0.0.1:65536", "not a port number"),
            ("::1:50051", "in brackets"),
            ("[::1:50051", "closing ]"),
            ("[::g]:50051", "not an IPv6 address"),
            ("[::1]50051", ":port"),
            ("grpc://127.0.0.1:50051", "grpc:// is not a gRPC address"),
            ("ftp://host:21", "host:port, http://host:port"),
            ("http://127.0.0.1:50051/oncegate", "has a path"),
            ("http://user:pw@127.0.0.1:50051", "user information"),
            ("a host:50051", "not a host name"),
        ] {
            let err = target(given).expect_err(given);
            assert!(err.contains(says), "{given:?}: {err}");
        }
    }
}

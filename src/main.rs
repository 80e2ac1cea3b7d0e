//! The `oncegate` binary: parse, resolve the settings, set up logging, run.

use oncegate::cli::Cli;
use oncegate::config::LogFormat;
use oncegate::error::{ConfigError, EXIT_CLOSED_PIPE, EXIT_CONFIG};
use oncegate::log_writer;
use oncegate::telemetry;
use std::process::ExitCode;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

// jemalloc: ~9 % less sidecar CPU per fresh claim than glibc malloc
// (docs/BENCHMARKS.md). Freed pages go back to the system after a second,
// not jemalloc's default ten, so peak RSS stays within the L1 budget plus
// 64 MiB (DESIGN §6).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    let (cli, deprecated) = match Cli::parse_from_env(std::env::args_os(), |k| std::env::var(k).ok()) {
        Ok(parsed) => parsed,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => EXIT_CONFIG,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let (format, level) = (cli.command.log_format(), cli.command.default_log_level());
    let threads = cli.command.worker_threads();
    let job = match cli.command.resolve() {
        Ok(job) => job,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match runtime(threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The trace exporter's gRPC client lives on the runtime.
    let traces = match runtime.block_on(async { start_traces() }) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let log_guard = init_tracing(format, level, traces.as_ref());
    warn_deprecated(&deprecated);
    let result = runtime.block_on(oncegate::cli::run(job));
    // Exports the spans still buffered while the runtime still runs.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match result {
        Ok(code) => code,
        // The reader closed stdout (`| head -1`): the usual status, no message.
        Err(e) if oncegate::cli::is_closed_pipe(&e) => ExitCode::from(EXIT_CLOSED_PIPE),
        // A setting only the running system can check (a privileged
        // database role, a retention below the database's floor).
        Err(e) if e.downcast_ref::<ConfigError>().is_some() => {
            report(format, &e, log_guard);
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            report(format, &e, log_guard);
            ExitCode::FAILURE
        }
    }
}

/// The runtime: `threads` workers (one: the current-thread scheduler, no
/// work stealing to wake a second thread for), or one per CPU.
fn runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Runtime::new(),
    }
}

/// An error, once (each cause in its chain once too, [`oncegate::cli::error_text`]): a log record when the logs are JSON (a collector reads
/// one stream of records), else an `error:` line on stderr (where the text
/// logs go too: the two would say the same thing twice), written after the
/// log lines still buffered, so it is the last thing the command says.
fn report(format: LogFormat, e: &anyhow::Error, log_guard: Option<log_writer::Guard>) {
    match format {
        LogFormat::Json => {
            tracing::error!(error = oncegate::cli::error_text(e), "oncegate failed");
            drop(log_guard);
        }
        LogFormat::Text => {
            drop(log_guard);
            eprintln!("error: {}", oncegate::cli::error_text(e));
        }
    }
}

/// A WARN for each retired setting still set (`config::deprecated`),
/// naming its successor; its value is never logged.
fn warn_deprecated(deprecated: &[&oncegate::config::deprecated::Deprecated]) {
    for d in deprecated {
        tracing::warn!(
            setting = d.env,
            successor = d.successor,
            "deprecated setting, still accepted this major version; its value is {}",
            d.now
        );
    }
}

/// The OTLP trace exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
fn start_traces() -> anyhow::Result<Option<telemetry::Exporter>> {
    if !telemetry::configured(|k| std::env::var(k).ok()) {
        return Ok(None);
    }
    telemetry::Exporter::start().map(Some)
}

/// Logs to stderr through [`log_writer`] (a decision's log line never waits
/// on the terminal, nor wakes a thread); JSON in production. Spans for the
/// trace exporter go only to it, so the log lines stay as they are.
fn init_tracing(
    format: LogFormat,
    default_level: &str,
    traces: Option<&telemetry::Exporter>,
) -> Option<log_writer::Guard> {
    use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Each filter states the most verbose level it lets through: a filter
    // without a hint makes the whole subscriber's level TRACE, and then
    // every TRACE span of every crate is made and dropped (h2 opens ~50 a
    // call).
    let filter =
        filter.and(filter_fn(|m| !telemetry::is_trace_span(m)).with_max_level_hint(LevelFilter::TRACE));
    let (writer, guard) = match log_writer::spawn(std::io::stderr()) {
        Ok((writer, guard)) => (BoxMakeWriter::new(writer), Some(guard)),
        Err(e) => {
            eprintln!("warning: no log writer thread ({e}); logging to stderr directly");
            (BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    // Colour only for a terminal: log files and collectors get plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_timer(oncegate::time_fmt::LogTime)
        .with_writer(writer);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
        LogFormat::Text => fmt.with_filter(filter).boxed(),
    };
    // (Built with `.with(None)` when traces are off: a subscriber of the log
    // layer alone, its per-layer filter the only one, lost log lines — a
    // WARN of the relay's, the reconciler's — in the integration tests.)
    let traces = traces.map(|t| t.layer());
    tracing_subscriber::registry().with(logs).with(traces).init();
    guard
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With traces off, no TRACE or DEBUG span of any crate is made (h2
    /// opens ~50 a call): the subscriber's level is the log's.
    #[test]
    fn with_traces_off_the_subscriber_level_is_the_logs() {
        let _guard = init_tracing(LogFormat::Text, "info", None);
        assert_eq!(
            tracing::level_filters::LevelFilter::current(),
            tracing::level_filters::LevelFilter::INFO
        );
        assert!(tracing::trace_span!(target: "h2::proto::streams", "pop_frame").is_disabled());
        assert!(tracing::debug_span!(target: "oncegate::gate", "detail").is_disabled());
        assert!(
            !tracing::info_span!(target: "oncegate::gate", "context").is_disabled(),
            "an INFO span of the log's own level is still made (its fields go into log lines)"
        );
    }
}

//! The `oncegate` binary: parse, resolve the settings, set up logging, run.

use clap::Parser;
use oncegate::cli::Cli;
use oncegate::config::LogFormat;
use oncegate::error::{ConfigError, EXIT_CONFIG};
use oncegate::log_writer;
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
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
    let job = match cli.command.resolve() {
        Ok(job) => job,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let _log_guard = init_tracing(format, level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(oncegate::cli::run(job)) {
        Ok(code) => code,
        // A setting only the running system can check (a privileged
        // database role, a retention below the database's floor).
        Err(e) if e.downcast_ref::<ConfigError>().is_some() => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "oncegate failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr through [`log_writer`] (a decision's log line never waits
/// on the terminal, nor wakes a thread); JSON in production.
fn init_tracing(format: LogFormat, default_level: &str) -> Option<log_writer::Guard> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let (writer, guard) = match log_writer::spawn(std::io::stderr()) {
        Ok((writer, guard)) => (BoxMakeWriter::new(writer), Some(guard)),
        Err(e) => {
            eprintln!("warning: no log writer thread ({e}); logging to stderr directly");
            (BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    // Colour only for a terminal: log files and collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    guard
}

//! The `oncegate` binary: parse, set up logging, dispatch.

use clap::Parser;
use oncegate::config::{Cli, Command, EXIT_CONFIG, LogFormat};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => EXIT_CONFIG,
            };
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    let invalid = match &cli.command {
        Command::Serve(args) => args.validate().err(),
        Command::Purge(args) => args.retention.validate().err(),
        _ => None,
    };
    if let Some(msg) = invalid {
        eprintln!("error: invalid configuration: {msg}");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    let format = match &cli.command {
        Command::Serve(a) => a.log_format,
        _ => LogFormat::Text,
    };
    let default_level = match &cli.command {
        Command::Serve(_) | Command::Relay(_) | Command::Purge(_) | Command::Migrate(_) => "info",
        _ => "warn",
    };
    let _log_guard = init_tracing(format, default_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(oncegate::client::dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "oncegate failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr through a non-blocking writer (a decision's log line never
/// waits on the terminal); JSON in production.
fn init_tracing(format: LogFormat, default_level: &str) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
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

//! `oncegate console`: its settings ([`ConsoleArgs`], resolved once: exit 64
//! on a bad one) and its run (`crate::console`, docs/CONSOLE.md).

use crate::config::StoreArgs;
use crate::console::Console;
use crate::console::state::ConsoleSettings;
use crate::error::ConfigError;
use crate::seal::signing::Keyring;
use crate::seal::verify::Checks;
use crate::store::StoreSettings;
use anyhow::Context;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Connections the console opens at most: a page reads a few statements in turn.
const CONSOLE_POOL: u32 = 4;

#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The console's listen address (HTTP). Loopback by default: put TLS and
    /// any wider exposure in front of it deliberately.
    #[arg(
        long = "console-listen",
        env = "ONCEGATE_CONSOLE_LISTEN",
        default_value = "127.0.0.1:9480"
    )]
    pub listen: SocketAddr,
    /// A file holding the bearer token every page needs (one line: printable
    /// ASCII, no spaces or `;`, at least 16 characters).
    #[arg(long = "console-token-file", env = "ONCEGATE_CONSOLE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Metrics listeners of the sidecars or relays (comma-separated
    /// host:port), read for the relay's breaker on the relay page.
    #[arg(
        long = "console-relay-metrics",
        env = "ONCEGATE_CONSOLE_RELAY_METRICS",
        value_delimiter = ','
    )]
    pub relay_metrics: Vec<SocketAddr>,
    /// Verify the sealed trail this often in the background (`0s`: only on
    /// demand, from the trail page).
    #[arg(long = "console-verify-interval", env = "ONCEGATE_CONSOLE_VERIFY_INTERVAL", default_value = "0s", value_parser = humantime::parse_duration)]
    pub verify_interval: Duration,
    /// Public keys the verification checks seal signatures with (as `audit
    /// verify --public-key`); repeat or comma-separate.
    #[arg(
        long = "console-public-key",
        env = "ONCEGATE_CONSOLE_PUBLIC_KEYS",
        value_delimiter = ',',
        value_name = "FILE"
    )]
    pub public_keys: Vec<PathBuf>,
    /// Refuse to start (exit 64) when the database role can do more than
    /// read (migrations/GRANTS.md, `oncegate_grant_console_role`).
    #[arg(long = "console-require-read-only", env = "ONCEGATE_CONSOLE_REQUIRE_READ_ONLY", default_value_t = true, action = clap::ArgAction::Set)]
    pub require_read_only: bool,
    /// Disbursements per page of an award.
    #[arg(
        long = "console-page-size",
        env = "ONCEGATE_CONSOLE_PAGE_SIZE",
        default_value_t = 50
    )]
    pub page_size: i64,
}

/// `oncegate console`, resolved.
pub struct ConsoleJob {
    pub store: StoreSettings,
    pub settings: ConsoleSettings,
}

/// Reads the token file, naming the setting on any problem.
fn read_token(path: Option<&PathBuf>) -> Result<String, ConfigError> {
    let Some(path) = path else {
        return Err(ConfigError::new(
            "ONCEGATE_CONSOLE_TOKEN_FILE is required: every console page needs a bearer token",
        ));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("ONCEGATE_CONSOLE_TOKEN_FILE {}: {e}", path.display())))?;
    let token = text.trim();
    if token.len() < 16
        || !token
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    {
        return Err(ConfigError::new(format!(
            "ONCEGATE_CONSOLE_TOKEN_FILE {}: the token must be one line of at least 16 printable ASCII characters, without spaces, ';' or ','",
            path.display()
        )));
    }
    Ok(token.to_string())
}

impl ConsoleArgs {
    pub fn resolve(self) -> Result<ConsoleJob, ConfigError> {
        let token = read_token(self.token_file.as_ref())?;
        if !(1..=1000).contains(&self.page_size) {
            return Err(ConfigError::new("ONCEGATE_CONSOLE_PAGE_SIZE must be 1 to 1000"));
        }
        let keys = match self.public_keys.is_empty() {
            true => None,
            false => Some(
                Keyring::load(&self.public_keys)
                    .map_err(|e| ConfigError::new(format!("ONCEGATE_CONSOLE_PUBLIC_KEYS: {e}")))?,
            ),
        };
        let store = self.store.settings(CONSOLE_POOL)?;
        if self.require_read_only && store.url.starts_with("sqlite://") {
            return Err(ConfigError::new(
                "the console needs Postgres (DATABASE_URL) when ONCEGATE_CONSOLE_REQUIRE_READ_ONLY is true: the embedded SQLite file has no read-only role",
            ));
        }
        Ok(ConsoleJob {
            store,
            settings: ConsoleSettings {
                listen: self.listen,
                token,
                relay_metrics: self.relay_metrics,
                verify_interval: self.verify_interval,
                checks: Checks { keys, anchors: None },
                require_read_only: self.require_read_only,
                page_size: self.page_size,
            },
        })
    }
}

pub async fn run(job: ConsoleJob) -> anyhow::Result<ExitCode> {
    let store = super::open_store(&job.store).await?;
    let console = Console::build(job.settings, store).await?;
    let signal = crate::shutdown::signal();
    tracing::info!(listen = %console.local_addr(), "console listening");
    console
        .run_until_shutdown(signal)
        .await
        .context("running the console")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn resolve(argv: &[&str]) -> Result<super::ConsoleJob, String> {
        match Cli::try_parse_from(argv).map_err(|e| e.to_string())?.command {
            Command::Console(args) => args.resolve().map_err(|e| e.0),
            _ => unreachable!("a console command"),
        }
    }

    #[test]
    fn the_console_needs_a_token_file_postgres_and_binds_loopback_by_default() {
        let err = resolve(&["oncegate", "console", "--database-url", "postgres://db/x"])
            .err()
            .unwrap();
        assert!(err.contains("ONCEGATE_CONSOLE_TOKEN_FILE is required"), "{err}");
        let dir = std::env::temp_dir().join(format!("og-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let spaced = dir.join("spaced");
        std::fs::write(&spaced, "a token with spaces in it\n").unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "0123456789abcdef-token\n").unwrap();
        for bad in [&short, &spaced, &dir.join("missing")] {
            let path = bad.display().to_string();
            let argv = [
                "oncegate",
                "console",
                "--database-url",
                "postgres://db/x",
                "--console-token-file",
                &path,
            ];
            let err = resolve(&argv).err().expect("refused");
            assert!(
                err.contains("ONCEGATE_CONSOLE_TOKEN_FILE") && err.contains(&path),
                "{err}"
            );
        }
        let path = good.display().to_string();
        let on_sqlite = ["oncegate", "console", "--console-token-file", &path];
        assert!(resolve(&on_sqlite).err().unwrap().contains("needs Postgres"));
        let ok = [
            "oncegate",
            "console",
            "--database-url",
            "postgres://u:pw@db/x",
            "--console-token-file",
            &path,
        ];
        let job = resolve(&ok).expect("resolves");
        assert!(job.settings.listen.ip().is_loopback());
        assert_eq!(job.settings.token, "0123456789abcdef-token");
        assert!(
            !format!("{:?}", job.settings).contains("0123456789abcdef"),
            "the token is masked"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Repeated warnings folded into one line per cause and interval.
//!
//! An outage fails every request the same way: at thousands of claims per
//! second a WARN line each would bury the one line that says what is wrong
//! under thousands per second, in a log pipeline someone pays for. So each
//! warning site has a [`Fold`]: the first occurrence of a cause is logged
//! at once (by the site, with its own fields), the ones after it within
//! [`INTERVAL`] are only counted, and when the interval is over one line
//! says how many were folded ("… (repeated)", with `repeated` and the
//! cause). [`flush`] writes the summaries whose interval ended without a
//! further occurrence (the gauge task calls it every few seconds, and once
//! more at shutdown). Metrics still count every occurrence.
//!
//! The cause is the error's text: one table refused, one broker down, one
//! disk full. Past [`MAX_CAUSES`] causes at one site within an interval,
//! the rest share one window.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long occurrences of one cause are folded after a line.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Causes tracked apart per site; more share one window.
pub const MAX_CAUSES: usize = 32;

/// The claim path: a claim the store failed (`gate`).
pub static CLAIMS: Fold = Fold::new("claim failed");
/// A batch transaction that failed and was retried item by item.
pub static GROUP_COMMIT: Fold = Fold::new("batch transaction failed; retrying items one by one");
/// The relay: a slot's step, renewals, rebalances, publishes.
pub static RELAY: Fold = Fold::new("relay step failed");
/// The audit spool: an append or a sync that failed.
pub static AUDIT_SPOOL: Fold = Fold::new("audit spool write failed");
/// The audit flusher: a batch of audit rows the store did not take.
pub static AUDIT_FLUSHER: Fold = Fold::new("audit write failed; will retry");

const ALL: [&Fold; 5] = [&CLAIMS, &GROUP_COMMIT, &RELAY, &AUDIT_SPOOL, &AUDIT_FLUSHER];

/// One warning site's windows, by cause.
pub struct Fold {
    site: &'static str,
    windows: Mutex<Vec<Window>>,
}

struct Window {
    cause: String,
    /// When the last line for this cause was written.
    since: Instant,
    /// Occurrences since that line, not logged.
    folded: u64,
}

/// The summary of a window that ended with occurrences folded.
struct Summary {
    cause: String,
    folded: u64,
    over: Duration,
}

impl Fold {
    pub const fn new(site: &'static str) -> Self {
        Self {
            site,
            windows: Mutex::new(Vec::new()),
        }
    }

    /// Whether the caller logs this occurrence of `cause` itself: `true`
    /// for the first in an interval; otherwise it is counted, and a
    /// summary line is written when its interval is over.
    pub fn first(&self, cause: &str) -> bool {
        let now = Instant::now();
        let summary = {
            let mut windows = self.lock();
            let at = match windows.iter().position(|w| w.cause == cause) {
                Some(at) => at,
                None if windows.len() < MAX_CAUSES => {
                    windows.push(Window {
                        cause: cause.to_string(),
                        since: now,
                        folded: 0,
                    });
                    return true;
                }
                // Too many causes: the oldest window takes this one too.
                None => 0,
            };
            let w = &mut windows[at];
            if now.duration_since(w.since) < INTERVAL {
                w.folded += 1;
                return false;
            }
            if w.folded == 0 {
                // A quiet interval: this one is a first occurrence again.
                w.since = now;
                return true;
            }
            let summary = Summary {
                cause: w.cause.clone(),
                folded: w.folded + 1,
                over: now.duration_since(w.since),
            };
            w.since = now;
            w.folded = 0;
            summary
        };
        self.write(&summary);
        false
    }

    /// Writes the summaries of windows whose interval is over, and forgets
    /// causes quiet for a whole interval.
    pub fn flush(&self) {
        let now = Instant::now();
        let mut due = Vec::new();
        self.lock().retain_mut(|w| {
            let over = now.duration_since(w.since);
            if over < INTERVAL {
                return true;
            }
            if w.folded == 0 {
                return false;
            }
            due.push(Summary {
                cause: w.cause.clone(),
                folded: w.folded,
                over,
            });
            w.since = now;
            w.folded = 0;
            true
        });
        for summary in &due {
            self.write(summary);
        }
    }

    /// Writes every pending summary now, whatever its age (shutdown).
    pub fn flush_all_now(&self) {
        let now = Instant::now();
        let due: Vec<Summary> = self
            .lock()
            .drain(..)
            .filter(|w| w.folded > 0)
            .map(|w| Summary {
                over: now.duration_since(w.since),
                cause: w.cause,
                folded: w.folded,
            })
            .collect();
        for summary in &due {
            self.write(summary);
        }
    }

    fn write(&self, s: &Summary) {
        tracing::warn!(
            repeated = s.folded,
            over_ms = s.over.as_millis() as u64,
            cause = %s.cause,
            "{} (repeated)",
            self.site
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Window>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes the summaries of every site whose interval is over.
pub fn flush() {
    for fold in ALL {
        fold.flush();
    }
}

/// Writes every site's pending summaries now (shutdown).
pub fn flush_now() {
    for fold in ALL {
        fold.flush_all_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first of a cause is the caller's to log, the rest of its
    /// interval are folded into one summary, and another cause is apart.
    #[tokio::test(start_paused = true)]
    async fn one_line_per_cause_and_interval() {
        let fold = Fold::new("test site");
        assert!(fold.first("permission denied for table disbursements"));
        let logged = (0..4_999)
            .filter(|_| fold.first("permission denied for table disbursements"))
            .count();
        assert_eq!(logged, 0, "the rest of the interval is folded");
        assert!(fold.first("read-only"), "another cause is logged at once");
        assert_eq!(fold.lock()[0].folded, 4_999);
        tokio::time::advance(INTERVAL).await;
        fold.flush();
        assert_eq!(fold.lock()[0].folded, 0, "the summary was written");
        assert_eq!(fold.lock().len(), 1, "the quiet cause is forgotten");
        tokio::time::advance(INTERVAL).await;
        fold.flush();
        assert!(fold.lock().is_empty());
        assert!(
            fold.first("permission denied for table disbursements"),
            "after a quiet interval the next is a first occurrence again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_occurrence_after_the_interval_writes_the_summary() {
        let fold = Fold::new("test site");
        assert!(fold.first("down"));
        assert!(!fold.first("down"));
        tokio::time::advance(INTERVAL).await;
        assert!(!fold.first("down"), "summarized, not logged in full");
        assert_eq!(fold.lock()[0].folded, 0);
        assert!(!fold.first("down"));
        assert_eq!(fold.lock()[0].folded, 1);
    }

    #[test]
    fn causes_past_the_bound_share_a_window() {
        let fold = Fold::new("test site");
        for i in 0..MAX_CAUSES {
            assert!(fold.first(&format!("cause {i}")));
        }
        assert!(!fold.first("one too many"));
        assert_eq!(fold.lock().len(), MAX_CAUSES);
        assert_eq!(fold.lock()[0].folded, 1);
    }
}

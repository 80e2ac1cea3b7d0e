//! What a reconcile run found: per check, how much it compared, how many
//! mismatches (all counted, the first few kept with their keys) and notes
//! on what it could not compare and why. Rendered for a human
//! ([`std::fmt::Display`]) or as JSON (`serde`).

use crate::time_fmt::serde_rfc3339;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use time::OffsetDateTime;
use uuid::Uuid;

/// The comparisons, each a gauge label of
/// `oncegate_reconciliation_mismatches{check}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Claims ↔ ledger rows: one each, same key, award, fingerprint and amount.
    Claims,
    /// Running totals (total, count, last sequence) = the award's ledger rows.
    Totals,
    /// Each award's ledger sequences are exactly 1..n.
    Sequences,
    /// One ledger event per ledger row, its fields matching the row.
    Outbox,
    /// Every published event is in the broker; the broker holds nothing
    /// the ledger does not know.
    Broker,
}

impl Check {
    pub const ALL: [Check; 5] = [
        Check::Claims,
        Check::Totals,
        Check::Sequences,
        Check::Outbox,
        Check::Broker,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claims => "claims",
            Self::Totals => "totals",
            Self::Sequences => "sequences",
            Self::Outbox => "outbox",
            Self::Broker => "broker",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Claims => "claims = ledger rows (key, award, fingerprint, amount)",
            Self::Totals => "running totals = sum, count and last sequence of each award's rows",
            Self::Sequences => "each award's sequences are exactly 1..n",
            Self::Outbox => "one event per ledger row, fields matching",
            Self::Broker => "published events = the broker's entries",
        }
    }
}

/// One thing that does not agree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// What kind of disagreement (`claim_without_ledger_row`, `total_differs`, …).
    pub kind: &'static str,
    pub idempotency_key: Option<String>,
    pub award_id: Option<String>,
    pub event_id: Option<Uuid>,
    pub detail: String,
}

/// One check's findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub check: Check,
    /// False when the check could not run (the broker without a sink).
    pub ran: bool,
    /// Items compared (keys, awards, events, broker entries).
    pub checked: u64,
    pub mismatches: u64,
    /// The first mismatches, in the order found.
    pub examples: Vec<Mismatch>,
    /// Counts of what was seen but, by design, not compared (with why in the name).
    pub notes: BTreeMap<&'static str, u64>,
    /// Why the check did not run, or what limited it.
    pub remark: Option<String>,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub store: &'static str,
    #[serde(serialize_with = "serde_rfc3339::serialize")]
    pub started_at: OffsetDateTime,
    pub duration_seconds: f64,
    /// True when every check that ran found nothing.
    pub clean: bool,
    pub mismatches: u64,
    pub checks: Vec<CheckReport>,
}

impl Report {
    pub fn check(&self, check: Check) -> &CheckReport {
        self.checks
            .iter()
            .find(|c| c.check == check)
            .expect("every check has a report")
    }
}

/// The findings while a run goes.
#[derive(Debug)]
pub(super) struct Tally {
    checks: BTreeMap<Check, CheckReport>,
    examples: usize,
}

impl Tally {
    pub(super) fn new(examples: usize) -> Self {
        let checks = Check::ALL
            .iter()
            .map(|&check| {
                let report = CheckReport {
                    check,
                    ran: true,
                    checked: 0,
                    mismatches: 0,
                    examples: Vec::new(),
                    notes: BTreeMap::new(),
                    remark: None,
                };
                (check, report)
            })
            .collect();
        Self { checks, examples }
    }

    fn get(&mut self, check: Check) -> &mut CheckReport {
        self.checks.get_mut(&check).expect("every check is tallied")
    }

    pub(super) fn checked(&mut self, check: Check, n: u64) {
        self.get(check).checked += n;
    }

    pub(super) fn note(&mut self, check: Check, what: &'static str, n: u64) {
        *self.get(check).notes.entry(what).or_default() += n;
    }

    pub(super) fn mismatch(&mut self, check: Check, m: Mismatch) {
        let keep = self.examples;
        let report = self.get(check);
        report.mismatches += 1;
        if report.examples.len() < keep {
            report.examples.push(m);
        }
    }

    pub(super) fn remark(&mut self, check: Check, ran: bool, remark: String) {
        let report = self.get(check);
        report.ran = ran;
        report.remark = Some(remark);
    }

    /// The kinds of the mismatches kept, in the order found (tests).
    #[cfg(test)]
    pub(super) fn mismatch_kinds(&self) -> Vec<&'static str> {
        self.checks
            .values()
            .flat_map(|c| c.examples.iter().map(|m| m.kind))
            .collect()
    }

    pub(super) fn finish(self, store: &'static str, started_at: OffsetDateTime, seconds: f64) -> Report {
        let checks: Vec<CheckReport> = self.checks.into_values().collect();
        let mismatches = checks.iter().map(|c| c.mismatches).sum();
        Report {
            store,
            started_at,
            duration_seconds: seconds,
            clean: mismatches == 0,
            mismatches,
            checks,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "reconcile: {} store, started {}, {:.2} s",
            self.store,
            crate::time_fmt::rfc3339(self.started_at),
            self.duration_seconds
        )?;
        writeln!(f, "{:<10} {:>10} {:>10}  what", "check", "checked", "mismatches")?;
        for c in &self.checks {
            if c.ran {
                let what = c.check.describe();
                writeln!(
                    f,
                    "{:<10} {:>10} {:>10}  {what}",
                    c.check.as_str(),
                    c.checked,
                    c.mismatches
                )?;
            } else {
                writeln!(f, "{:<10} {:>10} {:>10}  not checked", c.check.as_str(), "-", "-")?;
            }
        }
        for c in &self.checks {
            write_details(f, c)?;
        }
        match self.mismatches {
            0 => writeln!(f, "clean"),
            n => writeln!(f, "{n} mismatch{}", if n == 1 { "" } else { "es" }),
        }
    }
}

fn write_details(f: &mut fmt::Formatter<'_>, c: &CheckReport) -> fmt::Result {
    let name = c.check.as_str();
    if let Some(remark) = &c.remark {
        writeln!(f, "{name}: {remark}")?;
    }
    for (what, n) in &c.notes {
        writeln!(f, "{name}: {n} {}", what.replace('_', " "))?;
    }
    for m in &c.examples {
        let mut ids = String::new();
        if let Some(k) = &m.idempotency_key {
            ids.push_str(&format!(" key={k}"));
        }
        if let Some(a) = &m.award_id {
            ids.push_str(&format!(" award={a}"));
        }
        if let Some(e) = &m.event_id {
            ids.push_str(&format!(" event={e}"));
        }
        writeln!(f, "{name}: MISMATCH {}{ids}: {}", m.kind, m.detail)?;
    }
    if c.mismatches > c.examples.len() as u64 {
        writeln!(f, "{name}: … and {} more", c.mismatches - c.examples.len() as u64)?;
    }
    Ok(())
}

//! What reading the broker found, kept in memory bounded by the number of
//! awards, not by the length of the log: for each award, the range of
//! ledger-event sequences seen (and the few reported missing inside it);
//! for the rare events of other types (seals, effects), their ids.
//!
//! The broker must hold each award's events in sequence order (the relay
//! publishes them so, one slot holder at a time): an entry whose sequence
//! jumps past the next one is an award out of sequence, a mismatch. A
//! repeat of an event already seen is a mismatch on an exactly-once broker
//! (Kafka, read_committed) and at-least-once delivery elsewhere (a note).

use super::report::{Check, Mismatch, Tally};
use crate::broker::Coverage;
use std::collections::{BTreeSet, HashMap, HashSet};
use time::OffsetDateTime;
use uuid::Uuid;

/// An award's ledger events as the broker holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AwardSeen {
    first: i64,
    last: i64,
    /// Sequences in `first..=last` not seen where they belonged (each
    /// reported once); one arriving later is late, not a repeat.
    missing: BTreeSet<i64>,
}

/// What the broker holds, as far as the outbox pass needs it.
pub(super) struct BrokerSeen {
    awards: HashMap<String, AwardSeen>,
    others: HashSet<Uuid>,
    pub coverage: Coverage,
    /// Events published before this were in the broker before it was read.
    pub read_from: OffsetDateTime,
    pub describe: String,
    /// A repeated event is a mismatch (else at-least-once delivery).
    exactly_once: bool,
}

/// One ledger entry of the broker: its award, sequence, event id and place.
pub(super) struct LedgerEntry<'a> {
    pub award_id: &'a str,
    pub sequence: i64,
    pub event_id: Uuid,
    pub key: Option<&'a str>,
    pub position: &'a str,
}

impl BrokerSeen {
    pub fn new(coverage: Coverage, read_from: OffsetDateTime, describe: String, exactly_once: bool) -> Self {
        Self {
            awards: HashMap::new(),
            others: HashSet::new(),
            coverage,
            read_from,
            describe,
            exactly_once,
        }
    }

    /// Whether an event published at `t` must be among the broker's.
    pub fn must_hold(&self, t: OffsetDateTime) -> bool {
        t < self.read_from
            && match &self.coverage {
                Coverage::Everything => true,
                Coverage::Since(since) => t >= *since,
                Coverage::Unknowable(_) => false,
            }
    }

    /// Whether the broker holds this ledger event (its award's sequence).
    pub fn holds_ledger(&self, award_id: &str, sequence: i64) -> bool {
        self.awards
            .get(award_id)
            .is_some_and(|a| (a.first..=a.last).contains(&sequence) && !a.missing.contains(&sequence))
    }

    /// Whether the broker holds this event of another type.
    pub fn holds_other(&self, id: Uuid) -> bool {
        self.others.contains(&id)
    }

    /// An event of another type; a repeat is counted.
    pub fn other(&mut self, id: Uuid, position: &str, t: &mut Tally) {
        if !self.others.insert(id) {
            self.repeated(id, None, None, position, t);
        }
    }

    /// A ledger event, in the order the broker holds them.
    pub fn ledger(&mut self, e: &LedgerEntry<'_>, t: &mut Tally) {
        let trimmed = !matches!(self.coverage, Coverage::Everything);
        let Some(a) = self.awards.get_mut(e.award_id) else {
            self.awards.insert(
                e.award_id.to_string(),
                AwardSeen {
                    first: e.sequence,
                    last: e.sequence,
                    missing: BTreeSet::new(),
                },
            );
            if e.sequence != 1 && !trimmed {
                let detail = format!(
                    "entry {} is the award's first in the broker but has sequence {} (1..{} are missing or come later)",
                    e.position,
                    e.sequence,
                    e.sequence - 1
                );
                t.mismatch(Check::Broker, out_of_sequence(e, detail));
            }
            return;
        };
        if e.sequence == a.last + 1 {
            a.last = e.sequence;
        } else if e.sequence > a.last {
            let detail = format!(
                "entry {} has sequence {} right after {}: {}..{} missing or out of order there",
                e.position,
                e.sequence,
                a.last,
                a.last + 1,
                e.sequence - 1
            );
            a.missing.extend(a.last + 1..e.sequence);
            a.last = e.sequence;
            t.mismatch(Check::Broker, out_of_sequence(e, detail));
        } else if a.missing.remove(&e.sequence) {
            // Late: its gap was reported where it should have been.
        } else if e.sequence < a.first {
            let detail = format!(
                "entry {} has sequence {} after the award's {}..{}",
                e.position, e.sequence, a.first, a.last
            );
            a.first = e.sequence;
            t.mismatch(Check::Broker, out_of_sequence(e, detail));
        } else {
            self.repeated(e.event_id, e.key, Some(e.award_id), e.position, t);
        }
    }

    fn repeated(&self, id: Uuid, key: Option<&str>, award: Option<&str>, position: &str, t: &mut Tally) {
        if !self.exactly_once {
            t.note(
                Check::Broker,
                "entries_repeating_an_event_(at-least-once_delivery)",
                1,
            );
            return;
        }
        t.mismatch(
            Check::Broker,
            Mismatch {
                kind: "repeated_event",
                idempotency_key: key.map(str::to_string),
                award_id: award.map(str::to_string),
                event_id: Some(id),
                detail: format!(
                    "entry {position} repeats an event already in the {}, which delivers each event once",
                    self.describe
                ),
            },
        );
    }
}

fn out_of_sequence(e: &LedgerEntry<'_>, detail: String) -> Mismatch {
    Mismatch {
        kind: "award_out_of_sequence",
        idempotency_key: e.key.map(str::to_string),
        award_id: Some(e.award_id.to_string()),
        event_id: Some(e.event_id),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::{BrokerSeen, LedgerEntry};
    use crate::broker::Coverage;
    use crate::reconcile::report::Tally;
    use time::OffsetDateTime;
    use uuid::Uuid;

    fn seen(exactly_once: bool) -> BrokerSeen {
        BrokerSeen::new(
            Coverage::Everything,
            OffsetDateTime::now_utc(),
            "topic t".into(),
            exactly_once,
        )
    }

    /// Feeds (award, sequence) entries; the mismatch kinds found.
    fn feed(s: &mut BrokerSeen, entries: &[(&str, i64)]) -> Vec<&'static str> {
        let mut t = Tally::new(100);
        let ids: Vec<Uuid> = entries.iter().map(|_| Uuid::now_v7()).collect();
        for (i, (award, sequence)) in entries.iter().enumerate() {
            let e = LedgerEntry {
                award_id: award,
                sequence: *sequence,
                event_id: ids[i],
                key: None,
                position: "p",
            };
            s.ledger(&e, &mut t);
        }
        t.mismatch_kinds()
    }

    #[test]
    fn in_order_is_clean_and_interleaved_awards_do_not_matter() {
        let mut s = seen(true);
        assert!(feed(&mut s, &[("A", 1), ("B", 1), ("A", 2), ("B", 2), ("A", 3)]).is_empty());
        assert!(s.holds_ledger("A", 3) && s.holds_ledger("B", 2) && !s.holds_ledger("B", 3));
    }

    #[test]
    fn a_repeat_is_a_mismatch_only_where_delivery_is_exactly_once() {
        assert_eq!(
            feed(&mut seen(true), &[("A", 1), ("A", 2), ("A", 2)]),
            ["repeated_event"]
        );
        assert!(
            feed(
                &mut seen(false),
                &[("A", 1), ("A", 2), ("A", 1), ("A", 2), ("A", 3)]
            )
            .is_empty()
        );
    }

    #[test]
    fn a_jump_is_out_of_sequence_and_the_late_one_is_not_held_where_it_belonged() {
        let mut s = seen(false);
        assert_eq!(
            feed(&mut s, &[("A", 1), ("A", 3), ("A", 2)]),
            ["award_out_of_sequence"]
        );
        assert_eq!(feed(&mut seen(true), &[("A", 2)]), ["award_out_of_sequence"]);
        let mut s = seen(true);
        assert_eq!(feed(&mut s, &[("A", 1), ("A", 4)]), ["award_out_of_sequence"]);
        assert!(
            !s.holds_ledger("A", 2),
            "a sequence reported missing is not counted as held"
        );
    }
}

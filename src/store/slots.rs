//! The relay's slots as the store keeps them (DESIGN §4.2).
//!
//! The outbox is divided into a fixed number of slots by a stable hash of
//! the award ([`award_hash`]); a relay holds whole slots, each with a
//! generation bumped on every change of owner and a lease it renews. Every
//! write a relay makes for a slot (mark published, attempts, quarantine)
//! names the generation it holds ([`SlotLease`]) and changes nothing once
//! the slot has another: a pod that lost a slot can change nothing. Relays
//! say they are alive in `relay_members`, which is how each knows its fair
//! share.

use sha2::{Digest, Sha256};
use std::time::Duration;

/// The stable hash that places an award's events in a slot: the first four
/// bytes of the SHA-256 of the award id's UTF-8 bytes, read big-endian as an
/// unsigned 32-bit number. A documented function, not a database's
/// internal one: Postgres computes the same in SQL (`oncegate_award_hash`,
/// for rows older writers left without it), any other tool can too.
pub fn award_hash(award_id: &str) -> i64 {
    let digest = Sha256::digest(award_id.as_bytes());
    i64::from(u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]))
}

/// The slot of an award among `slots`: its hash modulo the count.
pub fn slot_of(award_id: &str, slots: i32) -> i32 {
    (award_hash(award_id) % i64::from(slots.max(1))) as i32
}

/// A relay's hold on one slot: the slot, the slot count it was taken under,
/// and the generation it was taken with. Every write for the slot names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotLease {
    pub slot: i32,
    pub slots: i32,
    pub generation: i64,
}

/// A relay process, as it says it is alive.
#[derive(Debug, Clone, Copy)]
pub struct RelayMember<'a> {
    /// Unique per process (a restarted pod is a new member).
    pub id: &'a str,
    /// The instance (pod) it runs in, for operators.
    pub instance: &'a str,
    /// The sink it publishes to (`kafka`, `redis`…): a resize checks it.
    pub sink: &'a str,
}

/// What a relay's heartbeat sees: the live relays' ids (sorted) and the
/// slot count in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayView {
    pub members: Vec<String>,
    pub slots: i32,
}

/// A slot as `oncegate outbox slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotRow {
    pub slot: i32,
    pub owner: Option<String>,
    pub generation: i64,
    /// How long its lease still runs; `None` when free or run out.
    #[serde(with = "humantime_serde_opt")]
    pub lease_left: Option<Duration>,
    /// Events waiting in it (not published, not quarantined).
    pub pending: i64,
}

/// A live relay, as `oncegate outbox slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberRow {
    pub member: String,
    pub instance: String,
    pub sink: String,
}

/// The slot table and the live relays.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SlotTable {
    pub slots: Vec<SlotRow>,
    pub members: Vec<MemberRow>,
}

mod humantime_serde_opt {
    pub fn serialize<S: serde::Serializer>(d: &Option<std::time::Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{award_hash, slot_of};

    /// The hash is a documented function: these values are its contract
    /// (computed independently: `printf %s AWD-1 | sha256sum`, first 8 hex digits).
    #[test]
    fn the_award_hash_is_the_first_four_bytes_of_sha256() {
        assert_eq!(award_hash(""), 0xe3b0_c442);
        assert_eq!(award_hash("abc"), 0xba78_16bf);
        assert!((0..=i64::from(u32::MAX)).contains(&award_hash("AWD-2026-0001")));
        assert_eq!(slot_of("abc", 8), (0xba78_16bf_i64 % 8) as i32);
        assert_eq!(slot_of("abc", 1), 0);
    }
}

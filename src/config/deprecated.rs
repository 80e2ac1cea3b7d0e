//! Settings renamed or retired: each keeps working for the whole major
//! version, with a WARN naming its successor and saying what its value does
//! now (the compatibility policy, `docs/UPGRADING.md`). A rename or a
//! retirement is one line of [`DEPRECATED`]; `docs/CONFIGURATION.md` lists
//! them (generated).

/// A setting no longer declared, still accepted.
#[derive(Debug, PartialEq, Eq)]
pub struct Deprecated {
    /// The environment variable a deployment may still set.
    pub env: &'static str,
    /// The setting that replaces it.
    pub successor: &'static str,
    /// What its value does now.
    pub now: &'static str,
}

/// Every deprecated setting.
pub const DEPRECATED: &[Deprecated] = &[Deprecated {
    env: "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID",
    successor: "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
    now: "ignored: it named one pod's producer, and each outbox slot now publishes with the \
          prefix and its number, the same on every pod, so that whoever takes a slot fences \
          whoever held it (a per-pod value would break that); set the prefix instead, one per \
          deployment relaying to a cluster",
}];

/// The deprecated settings set in the environment (`lookup`) whose
/// successor the subcommand reads (`reads`).
pub fn set_in(
    lookup: impl Fn(&str) -> Option<String>,
    reads: impl Fn(&str) -> bool,
) -> Vec<&'static Deprecated> {
    DEPRECATED
        .iter()
        .filter(|d| reads(d.successor) && lookup(d.env).is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deprecated_setting_is_reported_only_where_its_successor_is_read() {
        let set =
            |k: &str| (k == "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID").then(|| "grants-pod-0".to_string());
        let relay = |k: &str| k == "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX";
        assert_eq!(set_in(set, relay), vec![&DEPRECATED[0]]);
        assert!(
            set_in(set, |_| false).is_empty(),
            "a subcommand without the successor"
        );
        assert!(set_in(|_| None, relay).is_empty(), "not set");
    }
}

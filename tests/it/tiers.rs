//! Tier tests (L1, L2) — see below.

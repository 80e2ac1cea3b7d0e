//! The fair share of slots: every live relay computes the same from the same
//! list of members, so the shares add up to the slot count and the slots
//! spread evenly as relays come and go.

/// How many of `slots` slots `me` should hold among `members` (the live
/// relays' ids, sorted): each holds ⌊slots / n⌋, and the first `slots mod n`
/// in the list one more. A member not in the list (it has just joined, or
/// just been forgotten) counts as the last.
pub fn fair_share(slots: i32, members: &[String], me: &str) -> i32 {
    let n = members.len().max(1) as i32;
    let rank = members.iter().position(|m| m == me).unwrap_or(members.len()) as i32;
    slots / n + i32::from(rank < slots % n)
}

#[cfg(test)]
mod tests {
    use super::fair_share;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
    }

    #[test]
    fn shares_add_up_to_the_slots_and_differ_by_at_most_one() {
        for slots in 1..=20 {
            for n in 1..=7 {
                let m = members(n);
                let shares: Vec<i32> = m.iter().map(|me| fair_share(slots, &m, me)).collect();
                assert_eq!(
                    shares.iter().sum::<i32>(),
                    slots,
                    "{slots} slots, {n} pods: {shares:?}"
                );
                let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(hi - lo <= 1, "{slots} slots, {n} pods: {shares:?}");
            }
        }
    }

    #[test]
    fn one_relay_holds_every_slot_and_a_stranger_is_last() {
        assert_eq!(fair_share(8, &members(1), "pod-0"), 8);
        assert_eq!(fair_share(8, &members(3), "pod-0"), 3);
        assert_eq!(fair_share(8, &members(3), "pod-2"), 2);
        assert_eq!(fair_share(8, &members(3), "someone-else"), 2);
        assert_eq!(fair_share(2, &members(3), "pod-2"), 0);
    }
}

/*
 * The outbox relay (DESIGN §4): lease unpublished events (an award's later
 * event is held back while an earlier one is leased), publish them in order,
 * mark them published. Two relay replicas, two events of one award (e0
 * before e1); a relay may be killed at any point (between publish and mark
 * too) and a lease may expire at any moment, so the other replica re-leases.
 * The lease statement is modelled as atomic (one statement).
 *
 * At-least-once sinks (default): every event marked published was published
 * (ltl marked_was_published), and first occurrences are in per-award order
 * (assertion award_order).
 * -DKAFKA: each batch is one Kafka transaction that also carries the batch's
 * high-water mark; a relay settles (marks what the committed high-water mark
 * covers) before it leases, and the transactional id belongs to the relay
 * role, so taking it (init_transactions) fences the previous holder. A
 * read_committed consumer then sees every event exactly once (ltl exactly_once),
 * in order.
 *
 * Broken variants (each must fail on the property it breaks):
 *   BROKEN_MARK_BEFORE_PUBLISH            marked, then killed: an event never published
 *   BROKEN_NO_AWARD_GUARD                 a later event leased while an earlier is leased
 *   KAFKA + BROKEN_KAFKA_NO_SETTLE        killed after the Kafka commit, before the mark:
 *                                         republished, seen twice
 *   KAFKA + BROKEN_KAFKA_TXID_PER_INSTANCE  no fencing across replicas: a replica whose
 *                                         lease expired commits after the re-leaser
 */
#define NE 2
#define NR 2

bool pub[NE];           /* marked published */
byte lease[NE];         /* 0 free or expired, else 1 + holder */
byte seen[NE];          /* occurrences a consumer receives (read_committed for Kafka) */
byte hwm = 0;           /* Kafka: committed high-water mark (events below it) */
byte kowner = 0;        /* Kafka: who last initialised the shared transactional id */

ltl marked_was_published { [] ((!pub[0] || seen[0] > 0) && (!pub[1] || seen[1] > 0)) }
#ifdef KAFKA
ltl exactly_once { [] (seen[0] <= 1 && seen[1] <= 1) }
#endif

inline deliver(e) {
  assert(e == 0 || seen[e - 1] > 0 || seen[e] > 0);   /* property: award_order -- first occurrences in order */
  seen[e]++
}

proctype Relay(byte r) {
  bool mine[NE]; byte crashes = 0; byte e;
  do
  :: pub[0] && pub[1] -> break
  :: else ->
    atomic {
#if defined(KAFKA) && !defined(BROKEN_KAFKA_NO_SETTLE)
      e = 0; do :: e < hwm -> pub[e] = true; e++ :: else -> break od;   /* settle */
#endif
      if :: !pub[0] && lease[0] == 0 -> lease[0] = r + 1; mine[0] = true :: else -> skip fi;
#ifdef BROKEN_NO_AWARD_GUARD
      if :: !pub[1] && lease[1] == 0 -> lease[1] = r + 1; mine[1] = true
#else
      if :: !pub[1] && lease[1] == 0 && (pub[0] || mine[0] || lease[0] == 0) ->
            lease[1] = r + 1; mine[1] = true
#endif
         :: true -> skip     /* batch of one */
      fi;
#ifdef KAFKA
      kowner = r + 1     /* init_transactions: fences the previous holder */
#endif
    };
#ifdef BROKEN_MARK_BEFORE_PUBLISH
    atomic { if :: mine[0] -> pub[0] = true :: else -> skip fi;
             if :: mine[1] -> pub[1] = true :: else -> skip fi };
    if :: crashes < 1 -> crashes++; goto killed :: true -> skip fi;
#endif
#ifdef KAFKA
    /* one transaction: the batch and its high-water mark */
    atomic {
# ifndef BROKEN_KAFKA_TXID_PER_INSTANCE
      if :: kowner != r + 1 -> goto killed :: else -> skip fi;   /* fenced: aborted */
# endif
      if :: mine[0] -> deliver(0); hwm = 1 :: else -> skip fi;
      if :: mine[1] -> deliver(1); hwm = 2 :: else -> skip fi
    };
#else
    if :: mine[0] -> deliver(0) :: else -> skip fi;
    if :: crashes < 1 -> crashes++; goto killed :: true -> skip fi;
    if :: mine[1] -> deliver(1) :: else -> skip fi;
#endif
    /* killed between publish and mark? */
    if :: crashes < 1 -> crashes++; goto killed :: true -> skip fi;
    atomic {
      if :: mine[0] -> pub[0] = true; lease[0] = 0 :: else -> skip fi;
      if :: mine[1] -> pub[1] = true; lease[1] = 0 :: else -> skip fi
    };
killed:
    mine[0] = false; mine[1] = false
  od
}

active proctype Clock() {
end:
  do
  :: atomic { lease[0] != 0 -> lease[0] = 0 }   /* a lease expires */
  :: atomic { lease[1] != 0 -> lease[1] = 0 }
  od
}

init { atomic { run Relay(0); run Relay(1) } }

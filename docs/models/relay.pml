/*
 * The outbox relay across pods (DESIGN §4.2): the outbox is
 * divided into slots by a stable hash of the award; a pod takes a whole
 * slot in the store (owner, generation bumped on every take, a lease that
 * may run out at any moment while its holder still runs), reads the slot's
 * pending events in per-award order (the read joins the slot row on its
 * generation and live lease), publishes them and marks them published;
 * every write it makes for the slot is conditional on its generation.
 * Two pods, two events of one award (e0 before e1); a pod may be killed at
 * any point and comes back as a new pod that must take a slot again.
 *
 * At-least-once sinks (default): every event marked published was
 * published (ltl marked_was_published), first deliveries are in per-award
 * order (ltl award_order), and no pod writes for a slot it lost
 * (ltl owner_writes).
 *
 * -DKAFKA: the transactional id is the slot's (prefix + slot). Taking a slot
 * runs init_transactions (a new producer epoch: the former holder is fenced
 * and its open transaction aborted), then settles: marks published what the
 * slot's latest committed mark names, before anything is sent. Each batch is
 * one transaction with its mark. A commit fails when the producer's epoch is
 * no longer the id's (fenced, or the broker aborted the transaction at its
 * timeout, which bumps the epoch); a commit may also end with an unknown
 * outcome (committed or not): the pod keeps the slot and initialises and
 * settles again before it sends anything. A read_committed consumer then
 * sees every event exactly once (ltl exactly_once), in order. The lease
 * check before a commit is not modelled: a pod's clock may be wrong, so
 * safety must not rest on it (a pod whose lease ran out may commit).
 *
 * Broken variants (each must fail on the property it breaks):
 *   BROKEN_MARK_BEFORE_PUBLISH             marked, then killed: an event never published
 *   BROKEN_AWARD_SPLIT                     slots by event instead of award: e1 goes out
 *                                          from another slot before e0
 *   BROKEN_MARK_WITHOUT_GENERATION         a pod that lost the slot still writes for it
 *   KAFKA+BROKEN_KAFKA_NO_SETTLE           taking a slot does not settle: a batch committed
 *                                          but not marked is published again
 *   KAFKA+BROKEN_KAFKA_TXID_PER_POD        one transactional id per pod: taking a slot fences
 *                                          nobody, a pod whose lease ran out commits after
 *                                          the new holder
 *   KAFKA+BROKEN_KAFKA_UNKNOWN_RESENDS     after a commit with an unknown outcome the batch
 *                                          is sent again without settling
 */
#define NE 2
#define NR 2

#ifdef BROKEN_AWARD_SPLIT
#define NS 2
#define SLOT(e) (e)
#else
#define NS 1
#define SLOT(e) 0
#endif

byte owner[NS];     /* 1 + the pod holding the slot in the store; 0 free */
byte gen[NS];       /* the slot's generation */
bool live[NS];      /* its lease has not run out */
bool pub[NE];       /* marked published in the store */
byte seen[NE];      /* deliveries a consumer receives (read_committed with KAFKA) */
bool disorder;      /* e1 reached the consumer before e0 ever did */
bool stale_write;   /* a pod wrote for a slot whose generation is no longer its own */
byte expiries;      /* leases run out so far (bounded: the search must end) */

#ifdef KAFKA
# ifdef BROKEN_KAFKA_TXID_PER_POD
#  define NT NR
#  define TXID(s, r) (r)
# else
#  define NT NS
#  define TXID(s, r) (s)
# endif
byte epoch[NT];     /* the transactional id's producer epoch */
bool mk[NT * NE];   /* its latest committed mark: the events of its last transaction */
byte timeouts;      /* transactions the broker aborted at their timeout */
#endif

ltl marked_was_published { [] ((!pub[0] || seen[0] > 0) && (!pub[1] || seen[1] > 0)) }
ltl award_order { [] !disorder }
ltl owner_writes { [] !stale_write }
#ifdef KAFKA
ltl exactly_once { [] (seen[0] <= 1 && seen[1] <= 1) }
#endif

inline deliver(e) {
  disorder = disorder || (e == 1 && seen[0] == 0 && seen[1] == 0);
  seen[e]++
}

/* A write for slot s, conditional on the generation the pod took it with. */
inline write_pub(e) {
#ifdef BROKEN_MARK_WITHOUT_GENERATION
  stale_write = stale_write || gen[s] != mygen;
  pub[e] = true
#else
  if :: gen[s] == mygen -> pub[e] = true :: else -> skip fi
#endif
}

proctype Pod(byte r) {
  byte s, mygen, e, crashes, unknowns;
  bool b[NE];
#ifdef KAFKA
  byte myepoch;
#endif
start:
  b[0] = false; b[1] = false;
  /* take a free slot, or one whose lease ran out */
  atomic {
    if
    :: owner[0] == 0 || !live[0] -> s = 0
#if NS > 1
    :: owner[1] == 0 || !live[1] -> s = 1
#endif
    fi;
    owner[s] = r + 1; gen[s]++; live[s] = true; mygen = gen[s]
  };
#ifdef KAFKA
settle:
  /* init_transactions: fences the former holder, aborts its open transaction */
  atomic { epoch[TXID(s, r)]++; myepoch = epoch[TXID(s, r)] };
# ifndef BROKEN_KAFKA_NO_SETTLE
  atomic {
    e = 0;
    do
    :: e < NE && mk[TXID(s, r) * NE + e] -> write_pub(e); e++
    :: e < NE && !mk[TXID(s, r) * NE + e] -> e++
    :: e == NE -> break
    od;
    if :: gen[s] != mygen -> goto lost :: else -> skip fi
  };
# endif
#endif
  do
  :: /* the slot's pending events in per-award order, a batch of one or two;
        nothing once the slot is no longer this pod's */
     atomic {
       if :: gen[s] != mygen || !live[s] -> goto lost :: else -> skip fi;
       b[0] = SLOT(0) == s && !pub[0];
       /* the read holds back a later event only behind an earlier one of
          its award that waits for a retry, and sees only its own slot */
       b[1] = SLOT(1) == s && !pub[1] && (b[0] || pub[0] || SLOT(0) != s);
       if :: b[0] && b[1] -> if :: true -> skip :: true -> b[1] = false fi
          :: else -> skip
       fi;
       if :: !b[0] && !b[1] -> goto done :: else -> skip fi
     };
#ifdef BROKEN_MARK_BEFORE_PUBLISH
     atomic { if :: b[0] -> write_pub(0) :: else -> skip fi;
              if :: b[1] -> write_pub(1) :: else -> skip fi };
     if :: crashes < 1 -> crashes++; goto start :: true -> skip fi;
#endif
#ifdef KAFKA
resend:
     /* one transaction: the batch and its mark */
     if
     :: atomic { epoch[TXID(s, r)] == myepoch ->
          if :: b[0] -> deliver(0) :: else -> skip fi;
          if :: b[1] -> deliver(1) :: else -> skip fi;
          mk[TXID(s, r) * NE + 0] = b[0]; mk[TXID(s, r) * NE + 1] = b[1] }
     :: atomic { epoch[TXID(s, r)] != myepoch -> skip };
        /* fenced or aborted at its timeout: initialise and settle again
           (a pod that lost the slot is stopped by the generation) */
        goto settle
     :: unknowns < 1 -> unknowns++;
        /* the outcome is unknown: committed, or not */
        if
        :: atomic { epoch[TXID(s, r)] == myepoch ->
             if :: b[0] -> deliver(0) :: else -> skip fi;
             if :: b[1] -> deliver(1) :: else -> skip fi;
             mk[TXID(s, r) * NE + 0] = b[0]; mk[TXID(s, r) * NE + 1] = b[1] }
        :: true -> skip
        fi;
# ifdef BROKEN_KAFKA_UNKNOWN_RESENDS
        atomic { epoch[TXID(s, r)]++; myepoch = epoch[TXID(s, r)] };
        goto resend
# else
        goto settle
# endif
     fi;
#else
     if :: b[0] -> deliver(0) :: else -> skip fi;
     if :: crashes < 1 -> crashes++; goto start :: true -> skip fi;
     if :: b[1] -> deliver(1) :: else -> skip fi;
#endif
     /* killed between publish and mark? */
     if :: crashes < 1 -> crashes++; goto start :: true -> skip fi;
     atomic {
       if :: b[0] -> write_pub(0) :: else -> skip fi;
       if :: b[1] -> write_pub(1) :: else -> skip fi;
       if :: gen[s] != mygen -> goto lost :: else -> skip fi
     }
  od;
lost:
  /* the slot is another pod's: this one takes a slot again */
  if :: crashes < 1 -> crashes++; goto start :: true -> skip fi;
done:
  skip
}

active proctype Clock() {
end:
  do
  :: atomic { expiries < 2 && live[0] -> live[0] = false; expiries++ }
#if NS > 1
  :: atomic { expiries < 2 && live[1] -> live[1] = false; expiries++ }
#endif
#ifdef KAFKA
  :: atomic { timeouts < 1 -> epoch[0]++; timeouts++ }   /* the open transaction aborted at its timeout */
# if NT > 1
  :: atomic { timeouts < 1 -> epoch[1]++; timeouts++ }
# endif
#endif
  od
}

init { atomic { run Pod(0); run Pod(1) } }

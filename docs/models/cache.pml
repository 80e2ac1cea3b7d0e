/*
 * The cache tiers across a Postgres failover (DESIGN §7.2; src/primary.rs,
 * src/gate.rs): no cache answers for a commit the current primary lacks.
 *
 * One key; two sidecar instances, each a worker (deliveries) and a prober;
 * a shared L2; a primary (node 0) with an ASYNCHRONOUS standby (node 1)
 * whose replication may lag or stop at any point. The primary vanishes
 * without a reset (frozen, packets dropped: no call fails, it just does not
 * answer) and the standby is promoted: a commit not yet replicated is lost.
 *
 * The code modelled:
 * - The identity (system identifier + timeline) is read on a new connection
 *   and by the periodic probe only, never by a claim: the worker's store
 *   call runs on a pooled connection, here behind a pooler that reconnects
 *   it to whichever server is primary (the worst case: the claim may commit
 *   on the promoted standby without any identity read). Each read reaches
 *   the server at one step and its answer arrives at a later one (observe),
 *   possibly after the failover; an instance may have two in flight (the
 *   probe's and a new connection's).
 * - A confirmation counts from when its read was sent and lets caches
 *   answer for LEASE ticks (PrimaryWatch::trusted: the probe's interval
 *   plus its timeout, ONCEGATE_PRIMARY_PROBE_INTERVAL + _TIMEOUT), and
 *   only while not suspended (a failed probe or call suspends). A read
 *   older than the last confirmation that names another server is stale
 *   and ignored.
 * - A new identity is a new epoch: L1 entries of another epoch stop
 *   answering, L2 is read under the epoch's tag.
 * - Fills are tagged with the epoch read before the store was asked (none
 *   while suspended).
 *
 * Time: `now` ticks up to MAXT. The failover promotes the standby PROMOTE
 * ticks after the primary vanished, at the earliest (Patroni, CloudNativePG
 * and RDS take many seconds). The timing parameter: LEASE < PROMOTE is what
 * the design needs (`-DLEASE=3` breaks it). An L1 or L2 read is one step: an
 * L2 read's own round trip (bounded by ONCEGATE_REDIS_TIMEOUT) adds to the
 * window in the code; docs/GUARANTEES.md, "Failover, measured", gives the
 * measured figure.
 *
 * Property answers_current_primary (an assertion at every cache answer):
 * the current primary holds the claim answered for.
 *
 * Broken variants (spin -D...), each changes one thing:
 *   BROKEN_NO_EPOCH         a new identity does not move the caches to a new
 *                           epoch (L1 kept, L2 read under any tag)
 *   BROKEN_NO_LEASE         a confirmation lets caches answer until a probe
 *                           fails, however late that is
 *   BROKEN_LEASE_FROM_ANSWER a confirmation counts from when its answer
 *                           arrived, not from when its read was sent
 *   BROKEN_FILL_EPOCH_AFTER fills are tagged with the epoch read after the
 *                           store call returned
 *   BROKEN_STALE_READ       a late answer naming the old server moves the
 *                           epoch back to it
  *   -DLEASE=3               the lease outlasts the failover
 */

#define NI 2
#ifndef LEASE
#define LEASE 1         /* probe interval + probe timeout, in ticks */
#endif
#define PROMOTE 2       /* the primary vanished -> the standby promoted */
#define MAXT 3

bool has[2];            /* the claim on node 0 / node 1 */
byte cur = 0;           /* the current primary */
bool alive = true;      /* node 0 answers */
byte died = 0;          /* when it stopped */
byte now = 0;
bool l2[2];             /* L2 entry under the epoch tag of node 0 / node 1 */
byte l1[NI];            /* L1 entry: 0 none, else 1 + its epoch */
byte ident[NI];         /* the identity each instance last confirmed */
bool susp[NI];          /* suspended (set at start: nothing confirmed yet) */
byte conf_at[NI];       /* send time of the latest confirming read */

#define UP ((cur == 0 && alive) || cur == 1)
#ifdef BROKEN_NO_LEASE
#define FRESH(i) true
#else
#define FRESH(i) (now < conf_at[i] + LEASE)
#endif
#define TRUSTED(i) (!susp[i] && FRESH(i))
#ifdef BROKEN_NO_EPOCH
#define L1_HIT(i) (l1[i] != 0)
#define L2_HIT(i) (l2[0] || l2[1])
#else
#define L1_HIT(i) (l1[i] == ident[i] + 1)
#define L2_HIT(i) (l2[ident[i]])
#endif

/* PrimaryWatch::observe: a read of `seen`, sent at `sent`, answered now. */
inline observe(i, seen, sent) {
  if
#ifndef BROKEN_STALE_READ
  :: sent < conf_at[i] && seen != ident[i] -> skip     /* stale: ignored */
#endif
  :: else ->
     if
     :: seen != ident[i] ->
#ifndef BROKEN_NO_EPOCH
        l1[i] = 0;
#endif
        ident[i] = seen
     :: else -> skip
     fi;
#ifdef BROKEN_LEASE_FROM_ANSWER
     conf_at[i] = now;
#else
     if :: sent > conf_at[i] -> conf_at[i] = sent :: else -> skip fi;
#endif
     susp[i] = false
  fi
}

proctype Worker(byte i) {
  byte e, t;
  do
  :: /* a new connection reads the identity (the pool replaced one) */
     atomic { UP -> e = cur; t = now }
     atomic { observe(i, e, t); e = 0; t = 0 }
  :: atomic { TRUSTED(i) && L1_HIT(i) -> assert(has[cur]) }   /* L1 answers; property: answers_current_primary */
  :: atomic { TRUSTED(i) && !L1_HIT(i) && L2_HIT(i) -> assert(has[cur]);   /* L2 answers; property: answers_current_primary */
              l1[i] = ident[i] + 1 }
  :: /* a claim: the epoch first, then the store on a pooled connection */
     atomic { if :: TRUSTED(i) -> e = ident[i] + 1 :: else -> e = 0 fi }
     if
     :: atomic { UP -> has[cur] = true; t = cur }            /* committed */
#ifdef BROKEN_FILL_EPOCH_AFTER
        atomic { if :: TRUSTED(i) -> e = ident[i] + 1 :: else -> e = 0 fi }
#endif
        /* then, not atomically: fill L2 and L1 with that epoch */
        if :: e != 0 -> l2[e - 1] = true :: else -> skip fi;
        if :: e != 0 -> l1[i] = e :: else -> skip fi
     :: atomic { !UP -> susp[i] = true }                     /* the call failed */
     fi;
     e = 0; t = 0
  od
}

proctype Prober(byte i) {
  byte seen, sent;
  do
  :: atomic { UP -> seen = cur; sent = now }     /* the read reaches the server */
     atomic { observe(i, seen, sent); seen = 0; sent = 0 }   /* its answer, maybe late */
  :: atomic { !UP -> susp[i] = true }            /* the probe timed out */
  od
}

active proctype Cluster() {
  do
  :: atomic { now < MAXT -> now++ }
  :: atomic { alive && has[0] && !has[1] -> has[1] = true }   /* replication catches up */
  :: atomic { alive && cur == 0 -> alive = false; died = now } /* the primary vanishes */
  :: atomic { !alive && cur == 0 && now >= died + PROMOTE -> cur = 1 }   /* promote */
  od
}

init {
  atomic {
    susp[0] = true; susp[1] = true;
    run Worker(0); run Prober(0); run Worker(1); run Prober(1)
  }
}

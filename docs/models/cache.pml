/*
 * The cache tiers across a Postgres failover (DESIGN §2, §7; issue: no cache
 * answering for a lost commit).
 *
 * One key; two sidecar instances, each a worker (deliveries) and a prober
 * (the periodic identity probe, about a second); a shared L2; a primary
 * (node 0) with an ASYNCHRONOUS standby (node 1) whose replication may lag
 * or stop at any point. The primary is killed and the standby promoted: a
 * commit not yet replicated is lost.
 *
 * The design modelled: every L1 and L2 entry belongs to the epoch of the
 * server identity (system identifier + timeline) it was committed on (L2:
 * a key prefix per epoch, so FLUSHALL or another pod's old entries change
 * nothing); an instance answers from a cache only while not suspended and
 * only entries of the identity it last confirmed; a lost connection or a
 * failed probe suspends cache answers; the next connection that works reads
 * the identity: the same server resumes, a new one means a new epoch (L1
 * emptied, L2 read under the new prefix) first.
 *
 * Timing assumption (stated, not proved): promotion takes longer than the
 * probe interval, so every running instance has noticed the dead primary
 * (suspended) before the standby accepts writes (Patroni / CloudNativePG /
 * RDS Multi-AZ promote after many seconds; the probe runs every second).
 *
 * Invariant (assertion at every cache answer): the current primary holds
 * the claim answered for. Before the promotion the current primary is the
 * old one; after it, the promoted standby.
 *
 * Broken variants (spin -D...), each must produce a counterexample:
 *   BROKEN_NO_EPOCH      caches not emptied / not moved to a new epoch on failover
 *   BROKEN_NO_SUSPEND    a failed probe does not suspend cache answers
 *   BROKEN_LATE_FILL     L1 emptied on the identity change but entries carry no
 *                        epoch: a fill from a commit on the old primary that lands
 *                        after the emptying answers for a lost commit
 */

#define NI 2

bool has[2];            /* the claim on node 0 / node 1 */
byte cur = 0;           /* the current primary */
bool alive = true;      /* node 0 running */
bool l2[2];             /* L2 entry under the epoch of node 0 / node 1 */
byte l1[NI];            /* L1 entry: 0 none, else 1 + its epoch */
byte ident[NI];         /* the identity each instance last confirmed */
bool susp[NI];          /* cache answers suspended */
byte flushes = 0;

#define UP ((cur == 0 && alive) || cur == 1)

#ifdef BROKEN_NO_EPOCH
#define L1_OK(i) (l1[i] != 0 && !susp[i])
#define L2_OK(i) (l2[0] || l2[1]) && !susp[i]
#elif defined(BROKEN_LATE_FILL)
#define L1_OK(i) (l1[i] != 0 && !susp[i])
#define L2_OK(i) (l2[ident[i]] && !susp[i])
#elif defined(BROKEN_NO_SUSPEND)
#define L1_OK(i) (l1[i] == ident[i] + 1)
#define L2_OK(i) (l2[ident[i]])
#else
#define L1_OK(i) (l1[i] == ident[i] + 1 && !susp[i])
#define L2_OK(i) (l2[ident[i]] && !susp[i])
#endif

/* A connection that works reads the server identity; a new one: new epoch. */
inline confirm(i) {
  if
  :: cur != ident[i] ->
#ifndef BROKEN_NO_EPOCH
     l1[i] = 0;
#endif
     ident[i] = cur
  :: else -> skip
  fi;
  susp[i] = false
}

proctype Worker(byte i) {
  byte t;
  do
  :: atomic { L1_OK(i) -> assert(has[cur]) }   /* L1 hit; property: answers_current_primary */
  :: atomic { !L1_OK(i) && L2_OK(i) -> assert(has[cur]);   /* L2 hit, fills L1; property: answers_current_primary */
              l1[i] = ident[i] + 1 }
  :: atomic { UP -> confirm(i); has[cur] = true; t = cur } /* store: claim committed */
     /* then, not atomically: fill L2 and L1 with the commit's epoch */
     l2[t] = true;
     l1[i] = t + 1
  od
}

proctype Prober(byte i) {
  do
  :: atomic { UP -> confirm(i) }
#ifndef BROKEN_NO_SUSPEND
  :: atomic { !UP -> susp[i] = true }
#endif
  od
}

active proctype Cluster() {
  do
  :: atomic { alive && has[0] && !has[1] -> has[1] = true }   /* replication catches up */
  :: atomic { alive -> alive = false }                        /* SIGKILL the primary */
#ifdef BROKEN_NO_SUSPEND
  :: atomic { !alive && cur == 0 -> cur = 1 }                 /* promote */
#else
  :: atomic { !alive && cur == 0 && susp[0] && susp[1] -> cur = 1 }
#endif
  :: atomic { flushes < 1 -> flushes++; l2[0] = false; l2[1] = false }   /* FLUSHALL */
  od
}

init {
  atomic { run Worker(0); run Prober(0); run Worker(1); run Prober(1) }
}

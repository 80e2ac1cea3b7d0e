/*
 * The claim path (DESIGN §1, §2): L1 -> L2 lease (SET NX) -> one store
 * transaction (unique claim + effect) -> commit -> fill L2, L1 -> answer;
 * the consumer acks only after an answer.
 *
 * Two sidecar instances, one idempotency key delivered as two broker
 * messages (a producer retry), each redelivered until acked. Anything can
 * happen between steps: an instance crashes (loses L1 and its in-flight
 * work, its L2 token stays until it expires), a transaction aborts
 * (serialization failure: nothing written, token released), Redis expires
 * a token or is flushed (FLUSHALL), a message is delivered to both
 * instances at once.
 *
 * Invariants:
 *   - no double effect:            effects <= 1              (ltl at_most_one_effect)
 *   - no lost acknowledged claim:  acked[m] -> effects == 1  (ltl acked_has_effect)
 *   - a cache answers DUPLICATE only for a committed claim
 *                                                  (assertion answer_is_committed)
 *
 * Broken variants (spin -D...), each must fail on the property it breaks:
 *   BROKEN_ACK_BEFORE_COMMIT  the answer (and so the ack) precedes the commit
 *                             -> acked_has_effect
 *   BROKEN_TOKEN_IS_RESULT    another instance's L2 token read as a duplicate
 *                             -> answer_is_committed
 *   BROKEN_CLAIM_OUTSIDE_TX   claim checked in one transaction, effect in another
 *                             -> at_most_one_effect
 */

#define NI 2            /* instances */
#define NM 2            /* broker messages with the same key */
#define CRASHES 1       /* crashes per instance */

#define EMPTY  0
#define RESULT 9        /* L2 holds the committed result; else 1+instance = its token */

byte effects = 0;       /* ledger rows for the key */
bool claimed = false;   /* the committed claim row */
bool acked[NM];
byte l2 = EMPTY;
bool l1[NI];
byte flushes = 0;

ltl at_most_one_effect { [] (effects <= 1) }
ltl acked_has_effect { [] ((!acked[0] || effects == 1) && (!acked[1] || effects == 1)) }

inline answer_dup() {
  assert(claimed);      /* property: answer_is_committed -- a cache answers only for a committed claim */
  acked[m] = true
}

proctype Instance(byte me) {
  byte m; byte crashes = 0; bool held; bool dup;
  do
  :: acked[0] && acked[1] -> break
  :: else ->
    /* a (re)delivery of an unacked message; both instances may hold one */
    if :: !acked[0] -> m = 0 :: !acked[1] -> m = 1 fi;
    held = false;
    if
    :: l1[me] -> answer_dup(); goto next
    :: else -> skip
    fi;
    /* L2: SET key token NX GET */
    atomic {
      if
      :: l2 == EMPTY -> l2 = me + 1; held = true
      :: l2 == RESULT -> l1[me] = true; answer_dup(); goto next
      :: l2 != EMPTY && l2 != RESULT ->
#ifdef BROKEN_TOKEN_IS_RESULT
        answer_dup(); goto next
#else
        skip    /* another's token: the store decides */
#endif
      :: true -> skip    /* Redis unreachable / breaker open: skip L2 */
      fi
    }
#ifdef BROKEN_ACK_BEFORE_COMMIT
    acked[m] = true;
#endif
    /* the store transaction: commits, aborts, or the instance dies in it */
    if
    :: true ->
#ifdef BROKEN_CLAIM_OUTSIDE_TX
      dup = claimed;
      if :: !dup -> effects++; claimed = true :: else -> skip fi
#else
      atomic { dup = claimed; if :: !dup -> claimed = true; effects++ :: else -> skip fi }
#endif
    :: true ->    /* aborted: nothing written; release our own token */
      atomic { if :: held && l2 == me + 1 -> l2 = EMPTY :: else -> skip fi };
      goto next
    :: crashes < CRASHES -> crashes++; l1[me] = false; goto next   /* died before commit */
    fi;
    /* committed; the instance may die before answering */
    if
    :: crashes < CRASHES -> crashes++; l1[me] = false; goto next
    :: true -> skip
    fi;
    l2 = RESULT;          /* fill L2 (replaces any token) */
    l1[me] = true;        /* fill L1 */
    acked[m] = true;      /* answered CLAIMED/DUPLICATE: the consumer acks */
next: skip
  od
}

/* Redis: a token expires, or everything is flushed (once). */
active proctype Redis() {
end:
  do
  :: atomic { l2 != EMPTY && l2 != RESULT -> l2 = EMPTY }
  :: atomic { flushes < 1 -> flushes++; l2 = EMPTY }
  od
}

init {
  atomic { run Instance(0); run Instance(1) }
}

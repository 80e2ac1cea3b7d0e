/*
 * Effects outside the ledger (DESIGN §9): Begin takes the store's lease when
 * the record is new, released or expired (one statement, attempt + 1, a
 * fresh token); Complete and Release are fenced by the token in the
 * statement that changes the record; a cache answers only a completed record.
 * Two callers, one key, leases expiring at any moment, a caller killed at
 * any point (its lease left to expire).
 *
 * Invariants: at most one Complete succeeds (ltl one_complete); only the
 * current lease's token completes, so the stored response is the holder's
 * (ltl holder_completes); every cache answer is the completed record
 * (assertion cache_answers_completed).
 *
 * Broken variants (each must fail on the property it breaks):
 *   BROKEN_UNFENCED        Complete checks the state but not the token
 *                          -> holder_completes
 *   BROKEN_FILL_IN_PROGRESS  the caches are filled when the lease is taken
 *                          -> cache_answers_completed
 */
#define NONE 0
#define PROG 1
#define DONE 2
#define REL  3

byte st = NONE;
byte tok = 0;           /* 1 + the lease holder */
bool expired = false;
byte completes = 0;
byte resp = 0;          /* 1 + whose response is stored */
byte cached = 0;        /* L1/L2: 0 none, else the response cached */

ltl one_complete { [] (completes <= 1) }
ltl holder_completes { [] (st != DONE || resp == tok) }

proctype Caller(byte me) {
  byte kills = 0; bool mine;
  do
  :: atomic { cached != 0 -> assert(st == DONE && cached == resp) }   /* property: cache_answers_completed */
  :: atomic { st == DONE -> cached = resp }                           /* store answer, fills */
  :: atomic {
       (st == NONE || st == REL || (st == PROG && expired)) ->
         st = PROG; tok = me + 1; expired = false; mine = true
#ifdef BROKEN_FILL_IN_PROGRESS
         ; cached = me + 1
#endif
     };
     /* holding the lease: act (the provider call), then Complete or Release, or die */
     if
     :: true -> atomic {
#ifdef BROKEN_UNFENCED
          if :: st == PROG -> st = DONE; completes++; resp = me + 1
#else
          if :: st == PROG && tok == me + 1 -> st = DONE; completes++; resp = me + 1
#endif
             :: else -> mine = false     /* FAILED_PRECONDITION "lease lost" */
          fi };
        if :: mine -> cached = me + 1 :: else -> skip fi    /* fill after the commit */
     :: true -> atomic { if :: st == PROG && tok == me + 1 -> st = REL :: else -> skip fi }
     :: kills < 1 -> kills++     /* killed: the lease expires */
     fi;
     mine = false
  od
}

active proctype Clock() {
end:
  do
  :: atomic { st == PROG && !expired -> expired = true }
  od
}

init { atomic { run Caller(0); run Caller(1) } }

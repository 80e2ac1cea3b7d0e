/*
 * The synchronous-standby guard (ONCEGATE_REQUIRE_SYNC_REPLICA; DESIGN §7.3;
 * src/primary/guard.rs, src/store/postgres/tx.rs): no claim is answered
 * CLAIMED unless a synchronous standby has its commit, whatever the
 * primary's replication settings do while it serves.
 *
 * A primary, one synchronous standby, two sidecar workers each running
 * claim transactions one after the other (one claim each, NC = 2), and a
 * prober. The environment may change, at any step and in any order (up to
 * NENV changes): reload synchronous_standby_names empty or named (Patroni's
 * non-strict synchronous_mode, an operator), cut or restore the standby's
 * stream, set or reset `synchronous_commit = local` for the app role.
 *
 * Postgres as modelled (the reload timing measured on PostgreSQL 15:
 * docs/DEPLOYMENT.md, "A synchronous standby, all the time"):
 * - A reload is signalled by the postmaster to every session first and to
 *   the checkpointer last; a session takes it up before its next message
 *   (never within one); the checkpointer then updates the shared
 *   "synchronous standbys defined" flag and, when cleared, releases every
 *   commit waiting for a standby.
 * - A COMMIT waits for the standby when its session's synchronous_commit
 *   is on/remote_* and the shared flag is set; it returns when the standby
 *   has the commit or the flag is cleared.
 * - A role-level synchronous_commit applies to sessions opened after it.
 *
 * The guard as modelled (each transaction):
 * - BEGIN sets `synchronous_commit = on` for the transaction (SET LOCAL),
 * - its last statement before COMMIT reads the standbys (named, streaming)
 *   and rolls back when short (this keeps a claim from hanging; safety
 *   does not rest on it),
 * - after COMMIT returned, a statement of its own (another message) reads
 *   synchronous_standby_names: empty means the commit may not have waited,
 *   answered UNAVAILABLE, never CLAIMED.
 * The prober reads the settings and makes workers refuse at once while
 * short (the health and the gauge); safety does not rest on it either.
 *
 * Stated assumption (not closed by the code): the names are set again
 * (after being cleared) only while no claim transaction is open and its
 * reload reaches the checkpointer before the next claim commits. A restore
 * that races a commit can release it unreplicated yet be read as set after
 * it: cleared and set again between a COMMIT's release and the read after
 * it (one round trip), or set again and taken up by the claim's session
 * before the checkpointer, so that the COMMIT does not wait.
 * -DRESTORE_RACES drops the assumption and the model fails: that is the
 * remaining window, documented in docs/DEPLOYMENT.md ("A synchronous
 * standby, all the time").
 *
 * Property acked_is_replicated (assertion at every CLAIMED answer): the
 * standby has the commit, so a failover to it keeps it.
 *
 * Broken variants (spin -D...), each changes one thing:
 *   BROKEN_NO_SET_LOCAL      the transaction commits under the session's
 *                            synchronous_commit (a role-level `local` wins)
 *   BROKEN_NO_AFTER_READ     no read of the names after COMMIT
 *   BROKEN_AFTER_READ_SAME_MESSAGE  the names are read in the COMMIT's own
 *                            message (a reload is not taken up within one)
 *   RESTORE_RACES            the assumption above dropped (not a bug of the
 *                            code: the window it leaves open)
 */

#define NW 2
#define NENV 3

bool names = true;       /* synchronous_standby_names, as configured */
bool defined = true;     /* the checkpointer's shared flag */
bool streaming = true;   /* the standby streams */
bool role_local = false; /* ALTER ROLE app SET synchronous_commit = local */
bool pending[NW];        /* a reload signalled, not yet taken up */
bool committed[NW];      /* worker w's claim committed on the primary */
bool replicated[NW];     /* ... and on the standby */
bool refusing = false;   /* the prober found the settings short */
bool intx[NW];           /* w's claim transaction is open or its after-read pending */
byte changes = 0;

active proctype Env() {
  do
  :: atomic { changes < NENV && names ->                  /* reload: names cleared */
       changes++; names = false; pending[0] = true; pending[1] = true }
#ifdef RESTORE_RACES
  :: atomic { changes < NENV && !names ->                 /* reload: names set again */
       changes++; names = true; pending[0] = true; pending[1] = true }
#else
  :: atomic { changes < NENV && !names && defined == names && !intx[0] && !intx[1] ->
       changes++; names = true; defined = true; pending[0] = true; pending[1] = true }
#endif
  :: atomic { defined != names -> defined = names }      /* the checkpointer */
  :: atomic { changes < NENV -> changes++; streaming = !streaming }
  :: atomic { changes < NENV -> changes++; role_local = !role_local }
  od
}

active proctype Standby() {
  byte w;
  do
  :: atomic { streaming && committed[w] && !replicated[w] -> replicated[w] = true }
  :: atomic { w < NW - 1 -> w++ }
  :: atomic { w > 0 -> w-- }
  od
}

active proctype Prober() {
  do
  :: atomic { refusing = !(names && streaming && !role_local) }
  od
}

proctype Worker(byte w) {
  bool view = true;      /* the session's synchronous_standby_names */
  bool slocal = false;   /* the session's synchronous_commit is local */
  bool wait;
  do
  :: atomic { slocal = role_local; view = names; pending[w] = false }   /* a new session */
  :: atomic { refusing -> skip }                         /* UNAVAILABLE at once */
  :: atomic { !refusing && !committed[w] ->
       /* BEGIN (SET LOCAL), the claim, the standbys read: one message */
       intx[w] = true;
       if :: pending[w] -> view = names; pending[w] = false :: else -> skip fi;
       if
       :: !view || !streaming -> intx[w] = false; goto next   /* rolled back */
       :: else -> skip
       fi
     }
     atomic {
       /* COMMIT: a message of its own */
       if :: pending[w] -> view = names; pending[w] = false :: else -> skip fi;
#ifdef BROKEN_NO_SET_LOCAL
       wait = !slocal && defined;
#else
       wait = defined;
#endif
       committed[w] = true
     }
     if
     :: wait -> atomic { replicated[w] || !defined }      /* released */
     :: else -> skip
     fi;
     atomic {
       /* the read after COMMIT */
       intx[w] = false;
#ifndef BROKEN_AFTER_READ_SAME_MESSAGE
       if :: pending[w] -> view = names; pending[w] = false :: else -> skip fi;
#endif
#ifdef BROKEN_NO_AFTER_READ
       assert(replicated[w])            /* CLAIMED; property: acked_is_replicated */
#else
       if
       :: view -> assert(replicated[w]) /* CLAIMED; property: acked_is_replicated */
       :: else -> skip                  /* UNAVAILABLE: on the primary alone */
       fi
#endif
     };
     break
  od;
next:
  skip
}

init {
  atomic { run Worker(0); run Worker(1) }
}

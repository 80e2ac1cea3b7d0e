#define rand	pan_rand
#define pthread_equal(a,b)	((a)==(b))
#if defined(HAS_CODE) && defined(VERBOSE)
	#ifdef BFS_PAR
		bfs_printf("Pr: %d Tr: %d\n", II, t->forw);
	#else
		cpu_printf("Pr: %d Tr: %d\n", II, t->forw);
	#endif
#endif
	switch (t->forw) {
	default: Uerror("bad forward move");
	case 0:	/* if without executable clauses */
		continue;
	case 1: /* generic 'goto' or 'skip' */
		IfNotBlocked
		_m = 3; goto P999;
	case 2: /* generic 'else' */
		IfNotBlocked
		if (trpt->o_pm&1) continue;
		_m = 3; goto P999;

		 /* CLAIM safe */
	case 3: // STATE 1 - _spin_nvr.tmp:3 - [(!((((effects<=1)&&(!(acked[0])||(effects==1)))&&(!(acked[1])||(effects==1)))))] (6:0:0 - 1)
		
#if defined(VERI) && !defined(NP)
#if NCLAIMS>1
		{	static int reported1 = 0;
			if (verbose && !reported1)
			{	int nn = (int) ((Pclaim *)pptr(0))->_n;
				printf("depth %ld: Claim %s (%d), state %d (line %d)\n",
					depth, procname[spin_c_typ[nn]], nn, (int) ((Pclaim *)pptr(0))->_p, src_claim[ (int) ((Pclaim *)pptr(0))->_p ]);
				reported1 = 1;
				fflush(stdout);
		}	}
#else
		{	static int reported1 = 0;
			if (verbose && !reported1)
			{	printf("depth %d: Claim, state %d (line %d)\n",
					(int) depth, (int) ((Pclaim *)pptr(0))->_p, src_claim[ (int) ((Pclaim *)pptr(0))->_p ]);
				reported1 = 1;
				fflush(stdout);
		}	}
#endif
#endif
		reached[3][1] = 1;
		if (!( !((((((int)now.effects)<=1)&&( !(((int)now.acked[0]))||(((int)now.effects)==1)))&&( !(((int)now.acked[1]))||(((int)now.effects)==1))))))
			continue;
		/* merge: assert(!(!((((effects<=1)&&(!(acked[0])||(effects==1)))&&(!(acked[1])||(effects==1))))))(0, 2, 6) */
		reached[3][2] = 1;
		spin_assert( !( !((((((int)now.effects)<=1)&&( !(((int)now.acked[0]))||(((int)now.effects)==1)))&&( !(((int)now.acked[1]))||(((int)now.effects)==1))))), " !( !((((effects<=1)&&( !(acked[0])||(effects==1)))&&( !(acked[1])||(effects==1)))))", II, tt, t);
		/* merge: .(goto)(0, 7, 6) */
		reached[3][7] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 4: // STATE 10 - _spin_nvr.tmp:8 - [-end-] (0:0:0 - 1)
		
#if defined(VERI) && !defined(NP)
#if NCLAIMS>1
		{	static int reported10 = 0;
			if (verbose && !reported10)
			{	int nn = (int) ((Pclaim *)pptr(0))->_n;
				printf("depth %ld: Claim %s (%d), state %d (line %d)\n",
					depth, procname[spin_c_typ[nn]], nn, (int) ((Pclaim *)pptr(0))->_p, src_claim[ (int) ((Pclaim *)pptr(0))->_p ]);
				reported10 = 1;
				fflush(stdout);
		}	}
#else
		{	static int reported10 = 0;
			if (verbose && !reported10)
			{	printf("depth %d: Claim, state %d (line %d)\n",
					(int) depth, (int) ((Pclaim *)pptr(0))->_p, src_claim[ (int) ((Pclaim *)pptr(0))->_p ]);
				reported10 = 1;
				fflush(stdout);
		}	}
#endif
#endif
		reached[3][10] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC :init: */
	case 5: // STATE 1 - claim.pml:111 - [(run Instance(0))] (0:0:0 - 1)
		IfNotBlocked
		reached[2][1] = 1;
		if (!(addproc(II, 1, 0, 0)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 6: // STATE 2 - claim.pml:111 - [(run Instance(1))] (0:0:0 - 1)
		IfNotBlocked
		reached[2][2] = 1;
		if (!(addproc(II, 1, 0, 1)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 7: // STATE 4 - claim.pml:112 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[2][4] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Redis */
	case 8: // STATE 1 - claim.pml:105 - [(((l2!=0)&&(l2!=9)))] (8:0:1 - 1)
		IfNotBlocked
		reached[1][1] = 1;
		if (!(((((int)now.l2)!=0)&&(((int)now.l2)!=9))))
			continue;
		/* merge: l2 = 0(0, 2, 8) */
		reached[1][2] = 1;
		(trpt+1)->bup.oval = ((int)now.l2);
		now.l2 = 0;
#ifdef VAR_RANGES
		logval("l2", ((int)now.l2));
#endif
		;
		/* merge: .(goto)(0, 9, 8) */
		reached[1][9] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 9: // STATE 4 - claim.pml:106 - [((flushes<1))] (8:0:2 - 1)
		IfNotBlocked
		reached[1][4] = 1;
		if (!((((int)now.flushes)<1)))
			continue;
		/* merge: flushes = (flushes+1)(8, 5, 8) */
		reached[1][5] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.flushes);
		now.flushes = (((int)now.flushes)+1);
#ifdef VAR_RANGES
		logval("flushes", ((int)now.flushes));
#endif
		;
		/* merge: l2 = 0(8, 6, 8) */
		reached[1][6] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.l2);
		now.l2 = 0;
#ifdef VAR_RANGES
		logval("l2", ((int)now.l2));
#endif
		;
		/* merge: .(goto)(0, 9, 8) */
		reached[1][9] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 10: // STATE 11 - claim.pml:108 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[1][11] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Instance */
	case 11: // STATE 1 - claim.pml:49 - [((acked[0]&&acked[1]))] (0:0:0 - 1)
		IfNotBlocked
		reached[0][1] = 1;
		if (!((((int)now.acked[0])&&((int)now.acked[1]))))
			continue;
		_m = 3; goto P999; /* 0 */
	case 12: // STATE 4 - claim.pml:52 - [(!(acked[0]))] (0:0:0 - 1)
		IfNotBlocked
		reached[0][4] = 1;
		if (!( !(((int)now.acked[0]))))
			continue;
		_m = 3; goto P999; /* 0 */
	case 13: // STATE 5 - claim.pml:52 - [m = 0] (0:18:2 - 1)
		IfNotBlocked
		reached[0][5] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)((P0 *)_this)->m);
		((P0 *)_this)->m = 0;
#ifdef VAR_RANGES
		logval("Instance:m", ((int)((P0 *)_this)->m));
#endif
		;
		/* merge: .(goto)(18, 9, 18) */
		reached[0][9] = 1;
		;
		/* merge: held = 0(18, 10, 18) */
		reached[0][10] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P0 *)_this)->held);
		((P0 *)_this)->held = 0;
#ifdef VAR_RANGES
		logval("Instance:held", ((int)((P0 *)_this)->held));
#endif
		;
		_m = 3; goto P999; /* 2 */
	case 14: // STATE 6 - claim.pml:52 - [(!(acked[1]))] (0:0:0 - 1)
		IfNotBlocked
		reached[0][6] = 1;
		if (!( !(((int)now.acked[1]))))
			continue;
		_m = 3; goto P999; /* 0 */
	case 15: // STATE 7 - claim.pml:52 - [m = 1] (0:18:2 - 1)
		IfNotBlocked
		reached[0][7] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)((P0 *)_this)->m);
		((P0 *)_this)->m = 1;
#ifdef VAR_RANGES
		logval("Instance:m", ((int)((P0 *)_this)->m));
#endif
		;
		/* merge: .(goto)(18, 9, 18) */
		reached[0][9] = 1;
		;
		/* merge: held = 0(18, 10, 18) */
		reached[0][10] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P0 *)_this)->held);
		((P0 *)_this)->held = 0;
#ifdef VAR_RANGES
		logval("Instance:held", ((int)((P0 *)_this)->held));
#endif
		;
		_m = 3; goto P999; /* 2 */
	case 16: // STATE 10 - claim.pml:53 - [held = 0] (0:18:1 - 3)
		IfNotBlocked
		reached[0][10] = 1;
		(trpt+1)->bup.oval = ((int)((P0 *)_this)->held);
		((P0 *)_this)->held = 0;
#ifdef VAR_RANGES
		logval("Instance:held", ((int)((P0 *)_this)->held));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 17: // STATE 11 - claim.pml:55 - [(l1[me])] (0:0:0 - 1)
		IfNotBlocked
		reached[0][11] = 1;
		if (!(((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ])))
			continue;
		_m = 3; goto P999; /* 0 */
	case 18: // STATE 12 - claim.pml:42 - [assert(claimed)] (0:0:0 - 1)
		IfNotBlocked
		reached[0][12] = 1;
		spin_assert(((int)now.claimed), "claimed", II, tt, t);
		_m = 3; goto P999; /* 0 */
	case 19: // STATE 13 - claim.pml:43 - [acked[m] = 1] (0:0:1 - 1)
		IfNotBlocked
		reached[0][13] = 1;
		(trpt+1)->bup.oval = ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]);
		now.acked[ Index(((P0 *)_this)->m, 2) ] = 1;
#ifdef VAR_RANGES
		logval("acked[Instance:m]", ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 20: // STATE 20 - claim.pml:61 - [((l2==0))] (59:0:2 - 1)
		IfNotBlocked
		reached[0][20] = 1;
		if (!((((int)now.l2)==0)))
			continue;
		/* merge: l2 = (me+1)(59, 21, 59) */
		reached[0][21] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.l2);
		now.l2 = (((int)((P0 *)_this)->me)+1);
#ifdef VAR_RANGES
		logval("l2", ((int)now.l2));
#endif
		;
		/* merge: held = 1(59, 22, 59) */
		reached[0][22] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P0 *)_this)->held);
		((P0 *)_this)->held = 1;
#ifdef VAR_RANGES
		logval("Instance:held", ((int)((P0 *)_this)->held));
#endif
		;
		/* merge: .(goto)(59, 34, 59) */
		reached[0][34] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 21: // STATE 34 - claim.pml:71 - [.(goto)] (0:59:0 - 3)
		IfNotBlocked
		reached[0][34] = 1;
		;
		_m = 3; goto P999; /* 0 */
	case 22: // STATE 23 - claim.pml:62 - [((l2==9))] (27:0:1 - 1)
		IfNotBlocked
		reached[0][23] = 1;
		if (!((((int)now.l2)==9)))
			continue;
		/* merge: l1[me] = 1(0, 24, 27) */
		reached[0][24] = 1;
		(trpt+1)->bup.oval = ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]);
		now.l1[ Index(((P0 *)_this)->me, 2) ] = 1;
#ifdef VAR_RANGES
		logval("l1[Instance:me]", ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 23: // STATE 25 - claim.pml:42 - [assert(claimed)] (0:72:1 - 1)
		IfNotBlocked
		reached[0][25] = 1;
		spin_assert(((int)now.claimed), "claimed", II, tt, t);
		/* merge: acked[m] = 1(72, 26, 72) */
		reached[0][26] = 1;
		(trpt+1)->bup.oval = ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]);
		now.acked[ Index(((P0 *)_this)->m, 2) ] = 1;
#ifdef VAR_RANGES
		logval("acked[Instance:m]", ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]));
#endif
		;
		/* merge: goto next(72, 28, 72) */
		reached[0][28] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 24: // STATE 32 - claim.pml:69 - [(1)] (59:0:0 - 1)
		IfNotBlocked
		reached[0][32] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(59, 34, 59) */
		reached[0][34] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 25: // STATE 30 - claim.pml:67 - [(1)] (59:0:0 - 1)
		IfNotBlocked
		reached[0][30] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(59, 34, 59) */
		reached[0][34] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 26: // STATE 37 - claim.pml:82 - [dup = claimed] (0:0:1 - 1)
		IfNotBlocked
		reached[0][37] = 1;
		(trpt+1)->bup.oval = ((int)((P0 *)_this)->dup);
		((P0 *)_this)->dup = ((int)now.claimed);
#ifdef VAR_RANGES
		logval("Instance:dup", ((int)((P0 *)_this)->dup));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 27: // STATE 38 - claim.pml:82 - [(!(dup))] (67:0:3 - 1)
		IfNotBlocked
		reached[0][38] = 1;
		if (!( !(((int)((P0 *)_this)->dup))))
			continue;
		if (TstOnly) return 1; /* TT */
		/* dead 1: dup */  (trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((P0 *)_this)->dup;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P0 *)_this)->dup = 0;
		/* merge: claimed = 1(67, 39, 67) */
		reached[0][39] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.claimed);
		now.claimed = 1;
#ifdef VAR_RANGES
		logval("claimed", ((int)now.claimed));
#endif
		;
		/* merge: effects = (effects+1)(67, 40, 67) */
		reached[0][40] = 1;
		(trpt+1)->bup.ovals[2] = ((int)now.effects);
		now.effects = (((int)now.effects)+1);
#ifdef VAR_RANGES
		logval("effects", ((int)now.effects));
#endif
		;
		/* merge: .(goto)(67, 44, 67) */
		reached[0][44] = 1;
		;
		/* merge: .(goto)(0, 60, 67) */
		reached[0][60] = 1;
		;
		_m = 3; goto P999; /* 4 */
	case 28: // STATE 44 - claim.pml:82 - [.(goto)] (0:67:0 - 2)
		IfNotBlocked
		reached[0][44] = 1;
		;
		/* merge: .(goto)(0, 60, 67) */
		reached[0][60] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 29: // STATE 42 - claim.pml:82 - [(1)] (67:0:0 - 1)
		IfNotBlocked
		reached[0][42] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(67, 44, 67) */
		reached[0][44] = 1;
		;
		/* merge: .(goto)(0, 60, 67) */
		reached[0][60] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 30: // STATE 47 - claim.pml:85 - [((held&&(l2==(me+1))))] (72:0:2 - 1)
		IfNotBlocked
		reached[0][47] = 1;
		if (!((((int)((P0 *)_this)->held)&&(((int)now.l2)==(((int)((P0 *)_this)->me)+1)))))
			continue;
		if (TstOnly) return 1; /* TT */
		/* dead 1: held */  (trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((P0 *)_this)->held;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P0 *)_this)->held = 0;
		/* merge: l2 = 0(72, 48, 72) */
		reached[0][48] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.l2);
		now.l2 = 0;
#ifdef VAR_RANGES
		logval("l2", ((int)now.l2));
#endif
		;
		/* merge: .(goto)(72, 52, 72) */
		reached[0][52] = 1;
		;
		/* merge: goto next(0, 54, 72) */
		reached[0][54] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 31: // STATE 52 - claim.pml:85 - [.(goto)] (0:72:0 - 2)
		IfNotBlocked
		reached[0][52] = 1;
		;
		/* merge: goto next(0, 54, 72) */
		reached[0][54] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 32: // STATE 50 - claim.pml:85 - [(1)] (72:0:0 - 1)
		IfNotBlocked
		reached[0][50] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(72, 52, 72) */
		reached[0][52] = 1;
		;
		/* merge: goto next(0, 54, 72) */
		reached[0][54] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 33: // STATE 55 - claim.pml:87 - [((crashes<1))] (57:0:1 - 1)
		IfNotBlocked
		reached[0][55] = 1;
		if (!((((int)((P0 *)_this)->crashes)<1)))
			continue;
		/* merge: crashes = (crashes+1)(0, 56, 57) */
		reached[0][56] = 1;
		(trpt+1)->bup.oval = ((int)((P0 *)_this)->crashes);
		((P0 *)_this)->crashes = (((int)((P0 *)_this)->crashes)+1);
#ifdef VAR_RANGES
		logval("Instance:crashes", ((int)((P0 *)_this)->crashes));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 34: // STATE 57 - claim.pml:87 - [l1[me] = 0] (0:0:1 - 1)
		IfNotBlocked
		reached[0][57] = 1;
		(trpt+1)->bup.oval = ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]);
		now.l1[ Index(((P0 *)_this)->me, 2) ] = 0;
#ifdef VAR_RANGES
		logval("l1[Instance:me]", ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 35: // STATE 61 - claim.pml:91 - [((crashes<1))] (63:0:1 - 1)
		IfNotBlocked
		reached[0][61] = 1;
		if (!((((int)((P0 *)_this)->crashes)<1)))
			continue;
		/* merge: crashes = (crashes+1)(0, 62, 63) */
		reached[0][62] = 1;
		(trpt+1)->bup.oval = ((int)((P0 *)_this)->crashes);
		((P0 *)_this)->crashes = (((int)((P0 *)_this)->crashes)+1);
#ifdef VAR_RANGES
		logval("Instance:crashes", ((int)((P0 *)_this)->crashes));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 36: // STATE 63 - claim.pml:91 - [l1[me] = 0] (0:0:1 - 1)
		IfNotBlocked
		reached[0][63] = 1;
		(trpt+1)->bup.oval = ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]);
		now.l1[ Index(((P0 *)_this)->me, 2) ] = 0;
#ifdef VAR_RANGES
		logval("l1[Instance:me]", ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 37: // STATE 69 - claim.pml:94 - [l2 = 9] (0:0:1 - 2)
		IfNotBlocked
		reached[0][69] = 1;
		(trpt+1)->bup.oval = ((int)now.l2);
		now.l2 = 9;
#ifdef VAR_RANGES
		logval("l2", ((int)now.l2));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 38: // STATE 70 - claim.pml:95 - [l1[me] = 1] (0:0:1 - 1)
		IfNotBlocked
		reached[0][70] = 1;
		(trpt+1)->bup.oval = ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]);
		now.l1[ Index(((P0 *)_this)->me, 2) ] = 1;
#ifdef VAR_RANGES
		logval("l1[Instance:me]", ((int)now.l1[ Index(((int)((P0 *)_this)->me), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 39: // STATE 71 - claim.pml:96 - [acked[m] = 1] (0:0:1 - 1)
		IfNotBlocked
		reached[0][71] = 1;
		(trpt+1)->bup.oval = ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]);
		now.acked[ Index(((P0 *)_this)->m, 2) ] = 1;
#ifdef VAR_RANGES
		logval("acked[Instance:m]", ((int)now.acked[ Index(((int)((P0 *)_this)->m), 2) ]));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 40: // STATE 76 - claim.pml:99 - [-end-] (0:0:0 - 3)
		IfNotBlocked
		reached[0][76] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */
	case  _T5:	/* np_ */
		if (!((!(trpt->o_pm&4) && !(trpt->tau&128))))
			continue;
		/* else fall through */
	case  _T2:	/* true */
		_m = 3; goto P999;
#undef rand
	}


	switch (t->back) {
	default: Uerror("bad return move");
	case  0: goto R999; /* nothing to undo */

		 /* CLAIM safe */
;
		
	case 3: // STATE 1
		goto R999;

	case 4: // STATE 10
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC :init: */

	case 5: // STATE 1
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 6: // STATE 2
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 7: // STATE 4
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Redis */

	case 8: // STATE 2
		;
		now.l2 = trpt->bup.oval;
		;
		goto R999;

	case 9: // STATE 6
		;
		now.l2 = trpt->bup.ovals[1];
		now.flushes = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 10: // STATE 11
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Instance */
;
		;
		;
		;
		
	case 13: // STATE 10
		;
		((P0 *)_this)->held = trpt->bup.ovals[1];
		((P0 *)_this)->m = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		;
		
	case 15: // STATE 10
		;
		((P0 *)_this)->held = trpt->bup.ovals[1];
		((P0 *)_this)->m = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 16: // STATE 10
		;
		((P0 *)_this)->held = trpt->bup.oval;
		;
		goto R999;
;
		;
		;
		;
		
	case 19: // STATE 13
		;
		now.acked[ Index(((P0 *)_this)->m, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 20: // STATE 22
		;
		((P0 *)_this)->held = trpt->bup.ovals[1];
		now.l2 = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		
	case 21: // STATE 34
		goto R999;

	case 22: // STATE 24
		;
		now.l1[ Index(((P0 *)_this)->me, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 23: // STATE 26
		;
		now.acked[ Index(((P0 *)_this)->m, 2) ] = trpt->bup.oval;
		;
		goto R999;
;
		
	case 24: // STATE 32
		goto R999;
;
		
	case 25: // STATE 30
		goto R999;

	case 26: // STATE 37
		;
		((P0 *)_this)->dup = trpt->bup.oval;
		;
		goto R999;

	case 27: // STATE 40
		;
		now.effects = trpt->bup.ovals[2];
		now.claimed = trpt->bup.ovals[1];
	/* 0 */	((P0 *)_this)->dup = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;
;
		
	case 28: // STATE 44
		goto R999;
;
		
	case 29: // STATE 42
		goto R999;

	case 30: // STATE 48
		;
		now.l2 = trpt->bup.ovals[1];
	/* 0 */	((P0 *)_this)->held = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		
	case 31: // STATE 52
		goto R999;
;
		
	case 32: // STATE 50
		goto R999;

	case 33: // STATE 56
		;
		((P0 *)_this)->crashes = trpt->bup.oval;
		;
		goto R999;

	case 34: // STATE 57
		;
		now.l1[ Index(((P0 *)_this)->me, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 35: // STATE 62
		;
		((P0 *)_this)->crashes = trpt->bup.oval;
		;
		goto R999;

	case 36: // STATE 63
		;
		now.l1[ Index(((P0 *)_this)->me, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 37: // STATE 69
		;
		now.l2 = trpt->bup.oval;
		;
		goto R999;

	case 38: // STATE 70
		;
		now.l1[ Index(((P0 *)_this)->me, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 39: // STATE 71
		;
		now.acked[ Index(((P0 *)_this)->m, 2) ] = trpt->bup.oval;
		;
		goto R999;

	case 40: // STATE 76
		;
		p_restor(II);
		;
		;
		goto R999;
	}


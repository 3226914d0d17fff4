/*
 * The active/standby pair protocol: two instances, one leased lock L in the state store,
 * fenced store writes, controller writes gated by the local deadline and the lock delay.
 * It follows agent/client/lock.py (LeasedLock), agent/pair/lock_delay.py (LockDelay),
 * agent/pair/leadership.py and agent/runtime/agent.py (how they are called).
 * README.md next to this file says what is modelled, what is abstracted, and the results.
 *
 * Time is discrete, one tick = TICK_MS of real time, and every timer is kept as the
 * ticks remaining (relative time): the state space is finite and the search covers runs
 * of any length. An instance may let any number of ticks pass between two of its steps:
 * that is a process pause (SIGSTOP, SIGCONT) or a slow event loop.
 *
 * Two checks, one model:
 *   default   (1) at most one instance writes the controller at any moment
 *   -DSTORE   (2) no store write is accepted with a token older than one issued to
 *             another holder, and (2') none, on any key, with a token older than that of
 *             another holder that took over: whose token the store held on every key its
 *             takeover fences (store restarts included). The store build has two keys,
 *             two points of one device, each fenced by the token of its own last write
 * Each leaves out the other kind of write (the default check keeps the sync record's
 * presence, which the lock delay reads), and the store check leaves out the answers to
 * writes: that only removes losses (a fenced write rejected by another's token is one),
 * so each check covers the protocol with every kind of write and every answer.
 *
 * Deliberately broken protocols, each must give a counterexample:
 *   NO_DEADLINE    writes ignore the local deadline (a lease ends only on a refusal)
 *   NO_FENCING     the store accepts every write, whatever its token
 *   NO_LOCK_DELAY  a new lease drives at once, even after a store restart
 *   DROP_RULE      the lock delay runs from the moment a connection dropped while L was
 *                  last seen held by another, instead of from every (re)connection
 *   NO_CONFIRM     after a reconnect, writes go out with the token from before it
 *   TRUST_ABSENCE  a lock absent after a reconnect ends the lock delay, sync record or not
 *   SHORT_MARGIN   a margin one tick short of WDUR + 2 * DRIFT
 *   NO_GET         a renewal in doubt sends SET NEX at once, without reading L first
 *                  (the code before the fix: a NEX that re-creates a forgotten L counts
 *                  as a renewal of the same lease)
 *   LONG_DELAY     a write may take MARGIN - DRIFT + 1 ticks to reach the store: (2) then
 *                  fails whatever the protocol does, so this checks (2') instead, which
 *                  holds; with NO_FENCING as well, (2') fails
 *   CHECK_THEN_WAIT  a controller write asks the gate, then waits (a quiet line, the silent
 *                  interval, a slow write()) any number of ticks before its first byte,
 *                  without asking again: the driver's contract (agent/controller/driver.py)
 *                  is that nothing that can wait stands between the gate and the bytes
 *   FENCE_FIRST_KEY  the takeover fences the first point's key only: with LONG_DELAY, (2')
 *                  fails on the second (a late write of the former active accepted there
 *                  after the new holder took over)
 * RECHECK_DELAY: a lease re-reads the lock delay until it is over, instead of computing its
 * wait once at the acquisition. STORE_KEEPS: the store never restarts without its contents.
 * NO_SHORTCUT: store_kept_its_contents left out (the lock delay is never cut by a record).
 * NO_EXITS: no process stops or crashes (a smaller model for a quick check).
 * And WITNESS asserts that no lease taken after a store restart ever drives, so that the
 * search must show one that does: the model is not safe by being stuck.
 */

/* ---- constants: test_pair_model.py checks them against the code's defaults ---- */
#ifndef SCALE
#define SCALE         1   /* 3: the same protocol on a coarser clock, for a quick check */
#endif
#if SCALE == 1
#define TICK_MS     100   /* one tick of model time */
#define TTL          30   /* lease length: LockSettings().ttl_ms / TICK_MS */
#define RENEW        10   /* renewal period: TTL / RENEWALS_PER_TTL (see send_nex) */
#define MARGIN_       3   /* default_safety_margin_s(ttl) / TICK_MS */
#define LOCKDELAY    30   /* the lock delay: a full TTL (LockDelay(ttl_s)) */
#define DRIFT         1   /* clock rate error: a local span of about one TTL lasts this many
                             ticks more or less in real time (epsilon = DRIFT / TTL) */
#define WDUR          1   /* a controller write begun in tick k holds the line in ticks
                             k .. k + WDUR (it lasts less than WDUR + 1 ticks) */
#elif SCALE == 2
#define TICK_MS     150
#define TTL          20
#define RENEW         7
#define MARGIN_       2
#define LOCKDELAY    20
#define DRIFT         1
#define WDUR          0
#elif SCALE == 3
#define TICK_MS     300
#define TTL          10
#define RENEW         3
#define MARGIN_       1
#define LOCKDELAY    10
#define DRIFT         0
#define WDUR          0
#else
#error "SCALE is 1, 2 or 3"
#endif
#ifdef SHORT_MARGIN
#define MARGIN (MARGIN_ - 1)
#else
#define MARGIN MARGIN_
#endif
#ifdef LONG_DELAY
#define DELAY (MARGIN - DRIFT + 1)
#else
#define DELAY (MARGIN - DRIFT)  /* a store write arrives within DELAY ticks of its send */
#endif
#define MAXSER        8   /* serials in use are renumbered 1..n, n <= 7 (see compact) */
#define GONE          3   /* Lh: L is held by a process that exited without releasing it */

/* ---- the store ---- */
byte Lh;                  /* lock holder: 0 none, i + 1 for instance i, GONE */
byte Lr;                  /* ticks until L expires */
#ifdef STORE
byte Kt[2];               /* the tokens of two keys, two points of one device
                             (`<device>\<point>`): each that of its key's last write (a
                             serial, see compact), 0 none: absent, as every write is fenced */
byte iss[2];              /* latest serial issued to instance i */
#ifdef LONG_DELAY
byte tko[2];              /* highest serial of a lease of i that took over: its token was
                             that of every key its takeover fences, at once */
#endif
/* A sync record is in the store: either key stands for it (a write is any of the device's
 * writes, a point's value or the sync record written with it). */
#define REC (Kt[0] != 0 || Kt[1] != 0)
#ifdef FENCE_FIRST_KEY
#define FENCED        1   /* the keys a takeover fences (a mask): the first point's only */
#else
#define FENCED        3   /* every point's key (PointSync.take_over, each point) */
#endif
#else
bit  rec;                 /* a sync record is in the store */
#define REC (rec == 1)
#endif

/* ---- the instances, and what is on its way to them ---- */
bit  conn[2];             /* connected, and registered for L's notifications */
bit  held[2];             /* lease held locally (LeasedLock.held) */
bit  gate[2];             /* active: the lock delay is over for the current lease (latched) */
byte gw[2];               /* ticks the current lease still waits, as computed at acquisition */
byte na[2];               /* a SET L NEX awaits its answer: 0 none, 1 applied, 2 refused */
byte ga[2];               /* a renewal in doubt awaits its GET L: 0 none, 1 L was ours at
                             the store, 2 it was not (absent, or another's) */
bit  dn[2];               /* L's DELETE notification on the way */
bit  lk[2];               /* back on the link as standby, L seen absent: records read next */
bit  stp[2];              /* stopping (SIGTERM): writes no more, releases L next */
bit  dbt[2];              /* in doubt (LeasedLock.doubt, at a reconnect while held) until a
                             NEX sent after it succeeds: no token, not confirmed */
byte dl[2];               /* ticks until the local deadline */
#ifdef DROP_RULE
byte fr[2] = LOCKDELAY - DRIFT;  /* process start counts as L seen held */
#else
byte fr[2];               /* ticks until the lock delay is over (LockDelay.wait_s) */
#endif
#ifdef STORE
byte tok[2];              /* the current token */
byte wq[2];               /* a write on its way to the store: 0 none, 1 + ticks since sent */
byte wk[2];               /* its token */
bit  wp[2];               /* its key */
#define QUIET(i) (wq[i] == 0)  /* no store write on its way */
#else
byte md[2];               /* ticks a controller write of i may still hold the line */
#define QUIET(i) (md[i] == 0)  /* no write on the line */
#endif
#ifdef DROP_RULE
bit  seen[2];             /* L was last seen held by another */
#define SEEN(i, v) seen[i] = v
#else
#define SEEN(i, v) skip
#endif
#ifdef CHECK_THEN_WAIT
bit  wt[2];               /* a controller write passed the gate and waits to go out */
#define TKEY(i) wt[i]
#else
#define TKEY(i) 0
#endif
#ifdef WITNESS
bit  restarted;           /* the store has restarted */
bit  fresh[2];            /* i's lease was taken after that */
#endif
byte x, y;                /* scratch, 0 between steps */

#ifdef NO_DEADLINE
#define BEFORE_DEADLINE(i) true
#else
#define BEFORE_DEADLINE(i) (dl[i] > 0)
#endif
#ifdef NO_CONFIRM
#define CONFIRMED(i) true
#else
#define CONFIRMED(i) (dbt[i] == 0)
#endif
/* Leadership.may_drive(): active, within its lease, confirmed (not stopping). The doubt
 * starts at the reconnect, not when the link drops: the lease drives on while the link is
 * down. Store writes also need the link. */
#define MAY_DRIVE(i) (held[i] && gate[i] && !stp[i] && CONFIRMED(i) && BEFORE_DEADLINE(i))

/* ---- symmetry ----
 * The two instances are alike, so a state and the one with the instances swapped have
 * the same futures: the search keeps one of the two (the instance with the smaller
 * local state first). NO_SYMMETRY keeps both, for counterexamples that read well. */
#ifdef STORE
#define SKEY(i) (((tok[i] * 16 + wq[i]) * 8 + wk[i]) * 2 + wp[i])
#else
#define SKEY(i) md[i]
#endif
#ifdef DROP_RULE
#define DKEY(i) seen[i]
#else
#define DKEY(i) 0
#endif
#ifdef WITNESS
#define WKEY(i) fresh[i]
#else
#define WKEY(i) 0
#endif
#define KEY1(i) ((((((conn[i] * 2 + held[i]) * 2 + gate[i]) * 4 + na[i]) * 2 + dn[i]) * 64 \
                 + dl[i]) * 64 + fr[i])
#define KEY2(i) ((((((((SKEY(i)) * 64 + gw[i]) * 2 + lk[i]) * 2 + stp[i]) * 2 + dbt[i]) \
                 * 2 + DKEY(i)) * 2 + WKEY(i)) * 4 + ga[i]) * 2 + TKEY(i)
#define SWAP(v) y = v[0]; v[0] = v[1]; v[1] = y;
#define SWAP_AT(v, a, b) y = v[a]; v[a] = v[b]; v[b] = y;

/* The two keys are alike too (but for FENCE_FIRST_KEY): the one with the smaller store
 * state first. Judged alike for either order of the instances, so that the swap of the
 * instances below keeps it. */
#ifdef STORE
#define ON_WAY(i, k) (wq[i] != 0 && wp[i] == k)
#define KKEY(k) (Kt[k] * 3 + ON_WAY(0, k) + ON_WAY(1, k))
#endif

inline canon() {
#if defined(STORE) && !defined(NO_SYMMETRY) && !defined(FENCE_FIRST_KEY)
    if
    :: KKEY(1) < KKEY(0) ->
        SWAP(Kt)
        if :: wq[0] != 0 -> wp[0] = 1 - wp[0] :: else -> skip fi;
        if :: wq[1] != 0 -> wp[1] = 1 - wp[1] :: else -> skip fi;
        y = 0
    :: else -> skip
    fi;
#endif
#ifndef NO_SYMMETRY
    if
    :: KEY1(1) < KEY1(0) || (KEY1(1) == KEY1(0) && KEY2(1) < KEY2(0)) ->
        SWAP(conn) SWAP(held) SWAP(gate) SWAP(gw) SWAP(na) SWAP(ga) SWAP(dn) SWAP(lk) SWAP(stp)
        SWAP(dbt) SWAP(dl) SWAP(fr)
#ifdef STORE
        SWAP(tok) SWAP(wq) SWAP(wk) SWAP(wp) SWAP(iss)
#ifdef LONG_DELAY
        SWAP(tko)
#endif
#else
        SWAP(md)
#endif
#ifdef CHECK_THEN_WAIT
        SWAP(wt)
#endif
#ifdef DROP_RULE
        SWAP(seen)
#endif
#ifdef WITNESS
        SWAP(fresh)
#endif
        if :: Lh == 1 || Lh == 2 -> Lh = 3 - Lh :: else -> skip fi;
        y = 0
    :: else -> skip
    fi
#else
    skip
#endif
}

inline push(v, n) {
    if
    :: v < n -> v = n
    :: else -> skip
    fi
}

inline dec(v) {
    if
    :: v > 0 -> v--
    :: else -> skip
    fi
}

/* ---- tokens ----
 * A token is only ever compared. All tokens of one lease (its acquire and renewals)
 * order alike against every token of another lease, so a token is kept as the serial
 * of its lease: leases in the order the store created them. The serials in use are
 * renumbered 1..n after each step, order kept, so runs with any number of leases fit.
 * Tokens still to be sent come from tok, from iss while it may still become a token (a
 * NEX applied awaits its answer, or L is i's: a renewal keeps its serial), or are new.
 * Every other serial (a key's token, iss otherwise, those the properties remember) is
 * only ever compared with tokens sent later: those older than every one that may still
 * be sent order alike against all of them, and are kept as one, 1 (0 where only a
 * property reads it: it then asks nothing). */
#ifdef STORE
#define ISS_LIVE(i) (na[i] == 1 || Lh == i + 1)
#ifdef LONG_DELAY
#define SERIALS(F) F(iss[0]) F(iss[1]) F(tok[0]) F(tok[1]) F(wk[0]) F(wk[1]) F(Kt[0]) F(Kt[1]) \
                   F(tko[0]) F(tko[1])
#else
#define SERIALS(F) F(iss[0]) F(iss[1]) F(tok[0]) F(tok[1]) F(wk[0]) F(wk[1]) F(Kt[0]) F(Kt[1])
#endif
#define IS_X(v) || v == x
#define ABOVE_X(v) || v > x
#define DEC_ABOVE_X(v) if :: v > x -> v-- :: else -> skip fi;
#define MAX_INTO_X(v) if :: v > x -> x = v :: else -> skip fi;
#define MIN_INTO_X(v) if :: v != 0 && v < x -> x = v :: else -> skip fi;
#define OLD_TO(v, n) if :: v != 0 && v < x -> v = n :: else -> skip fi;

inline compact() {
    x = MAXSER;                  /* the oldest serial that may still be sent */
    MIN_INTO_X(tok[0]) MIN_INTO_X(tok[1]) MIN_INTO_X(wk[0]) MIN_INTO_X(wk[1])
    if :: ISS_LIVE(0) -> MIN_INTO_X(iss[0]) :: else -> skip fi;
    if :: ISS_LIVE(1) -> MIN_INTO_X(iss[1]) :: else -> skip fi;
    OLD_TO(Kt[0], 1) OLD_TO(Kt[1], 1)
#ifdef LONG_DELAY
    OLD_TO(tko[0], 0) OLD_TO(tko[1], 0)
    if :: !ISS_LIVE(0) -> iss[0] = 0 :: else -> skip fi;  /* read by nothing then */
    if :: !ISS_LIVE(1) -> iss[1] = 0 :: else -> skip fi;
#else
    if :: !ISS_LIVE(0) -> OLD_TO(iss[0], 1) :: else -> skip fi;  /* (2) reads it */
    if :: !ISS_LIVE(1) -> OLD_TO(iss[1], 1) :: else -> skip fi;
#endif
    x = 1;
    do
    :: !(false SERIALS(IS_X)) && (false SERIALS(ABOVE_X)) -> SERIALS(DEC_ABOVE_X) skip
    :: (false SERIALS(IS_X)) -> x++
    :: else -> break
    od;
    x = 0
}

inline new_serial(v) {    /* newer than every token in use */
    x = 0;
    SERIALS(MAX_INTO_X) v = x + 1;
    assert(v < MAXSER);
    x = 0
}
#define COMPACT compact()
#else
#define COMPACT skip
#endif

/* (1) at most one instance writes the controller at any moment. A write may begin at
 * any moment its instance may drive and holds the line WDUR more ticks, so two writes
 * can overlap iff the instances may drive within WDUR ticks of each other: md[i] tracks
 * that, which checks every timing of the writes at once. The gate and the first byte are
 * one step (the driver waits for a quiet line before it asks the gate, never after);
 * CHECK_THEN_WAIT splits them: a write that passed the gate goes out later (go_out). */
inline observe() {
#ifndef STORE
#ifdef CHECK_THEN_WAIT
    if :: MAY_DRIVE(0) -> wt[0] = 1 :: else -> skip fi;
    if :: MAY_DRIVE(1) -> wt[1] = 1 :: else -> skip fi;
#else
    if :: MAY_DRIVE(0) -> md[0] = WDUR + 1 :: else -> skip fi;
    if :: MAY_DRIVE(1) -> md[1] = WDUR + 1 :: else -> skip fi;
#endif
    assert(md[0] == 0 || md[1] == 0);
#endif
#ifdef WITNESS
    assert(!(fresh[0] && MAY_DRIVE(0)) && !(fresh[1] && MAY_DRIVE(1)));
#endif
    skip
}

/* A loss (a refused renewal, a lease the store forgot, the local deadline) stops the
 * driving at once and ends the lease (LeasedLock._lose); the lock delay is left as it is.
 * An answer still on its way belongs to the lost lease and is ignored (the epoch). */
inline lose(i) {
    printf("%d: lease lost\n", i);
    held[i] = 0; gate[i] = 0; gw[i] = 0; dl[i] = 0; na[i] = 0; ga[i] = 0; dbt[i] = 0;
#ifdef STORE
    tok[i] = 0;
#endif
    COMPACT
}

/* The lock delay (Leadership._take_over): a new lease computes its wait once, then
 * sleeps it out (gw). It may compute it later than its acquisition (it waits for a
 * step-down in progress), and a wait computed later ends no earlier than gw does unless
 * the lock delay was cut to 0 meanwhile (a DELETE seen, a sync record found): so the
 * gate opens when either is 0. Latched for the lease: active until the lease is lost. */
inline open_gate(i) {
#ifdef NO_LOCK_DELAY
    gate[i] = held[i]
#else
    if
#ifdef RECHECK_DELAY
    :: held[i] && !gate[i] && fr[i] == 0 ->
#else
    :: held[i] && !gate[i] && (gw[i] == 0 || fr[i] == 0) ->
#endif
        gate[i] = 1; gw[i] = 0; printf("%d: lock delay over, active\n", i)
    :: else -> skip
    fi
#endif
}

inline seen_other(i) {    /* LockDelay.seen_held: a GET or a refused NEX showed another */
    push(fr[i], LOCKDELAY - DRIFT);
    SEEN(i, 1)
}

/* Instance i's link drops (or the store restarts): answers and notifications on their
 * way are lost, the client fails what it waited for (clean start: nothing is resent). A
 * write already on its way may still be applied. */
inline drop(i) {
    conn[i] = 0; na[i] = 0; ga[i] = 0; dn[i] = 0; lk[i] = 0;
#ifndef DROP_RULE
    if :: !held[i] -> fr[i] = 0 :: else -> skip fi;  /* connect() sets it again */
#endif
#ifdef DROP_RULE
    if
    :: seen[i] -> push(fr[i], LOCKDELAY - DRIFT)
    :: else -> skip
    fi;
#endif
    skip
}

/* A lease lost to its deadline resets the link (Leadership._on_lost, Session.drop_link):
 * its requests fail, answers and notifications on their way are lost; the instance
 * reconnects (a lock delay, in doubt of nothing: no lease). This could happen anyway
 * (lose_message): it only removes behaviours. A store write on its way is kept, as in
 * drop(): the reset drops what the link still holds, but a write may be at the broker
 * already, and keeping it only adds behaviours (without it, LONG_DELAY's late write
 * could never arrive and NO_FENCING would give no counterexample). */
inline drop_link(i) {
    if :: conn[i] -> printf("%d: resets its link\n", i) :: else -> skip fi;
    drop(i)
}

/* ---------------------------------------------------------------- instance steps */

/* Connect, register for L's notifications, GET L (Agent._subscribe at start,
 * Agent._on_reconnect after). */
inline connect(i) {
    d_step {
        !conn[i] ->
        conn[i] = 1;
#ifndef DROP_RULE
        /* LockDelay.lost_sight (LockDelay.starting at start): whoever held L while we
         * could not see it may still be driving. */
        push(fr[i], LOCKDELAY - DRIFT);
#endif
        dbt[i] = held[i];
        if
        :: Lh != 0 && Lh != i + 1 -> seen_other(i)
        :: else -> SEEN(i, 0)
        fi;
        if   /* a standby looks for a sync record next (Agent._look_and_contend) */
        :: Lh == 0 && !gate[i] -> lk[i] = 1
        :: else -> skip
        fi;
        printf("%d: connects (lock delay %d)\n", i, fr[i]); canon()
    }
}

/* Leadership.store_kept_its_contents: L was absent, and a sync record read after that
 * is there: the lock delay is over. (TRUST_ABSENCE: without the record.) */
inline look(i) {
    d_step {
        lk[i] && conn[i] ->
        lk[i] = 0;
#ifdef TRUST_ABSENCE
        if :: true ->
#elif defined(NO_SHORTCUT)
        if :: false ->
#else
        if :: REC ->
#endif
            fr[i] = 0; SEEN(i, 0);
            printf("%d: L absent, a sync record kept: no lock delay\n", i); open_gate(i)
        :: else -> skip
        fi;
        observe(); canon()
    }
}

/* SET L h NEX PX TTL, to acquire or renew, applied by the store in the tick it is sent
 * in: applying it later would only move L's expiry later, against a deadline counted
 * from the send (and a request lost on its way is a request not sent). Renewals may go
 * at any moment, not only every RENEW ticks. One awaits its answer at a time: overlapping
 * ones are covered, as an answer only ever moves the deadline to its own send time +
 * TTL - MARGIN (the later of the two, LeasedLock._settle), and each request extends L. */
inline apply_nex(i) {
    printf("%d: sends SET L NEX\n", i);
    if
    :: Lh == 0 || Lh == i + 1 ->
#ifdef STORE
        if
        :: Lh == 0 -> new_serial(iss[i])    /* a new lease */
        :: else -> skip                     /* a renewal: the same lease */
        fi;
#endif
        printf("store: L = %d for %d ticks\n", i, TTL);
        Lh = i + 1; Lr = TTL; na[i] = 1
        /* The SET notification to the other instance is left out (as if lost): it
         * could only lengthen that instance's lock delay. */
    :: else -> na[i] = 2
    fi
}

/* An acquisition, or a renewal of a lease not in doubt: SET NEX at once
 * (LeasedLock.try_acquire, LeasedLock.renew). NO_GET: a renewal in doubt too. */
#ifdef NO_GET
#define NEX_NOW(i) true
#else
#define NEX_NOW(i) (!held[i] || !dbt[i])
#endif
inline send_nex(i) {
    d_step {
        conn[i] && na[i] == 0 && ga[i] == 0 && !stp[i] && NEX_NOW(i) ->
        apply_nex(i);
        COMPACT; canon()
    }
}

/* A renewal in doubt (LeasedLock.renew after doubt()) reads L first: SET NEX cannot tell
 * extending L from creating it anew after a store that forgot it. The GET and the SET
 * are two requests: the GET is applied now, its answer comes back later, and the store
 * may change in between (L expires, the store restarts; a restart drops the link, and
 * with it the answer). */
inline send_get(i) {
    d_step {
        conn[i] && na[i] == 0 && ga[i] == 0 && !stp[i] && !NEX_NOW(i) ->
        printf("%d: in doubt, sends GET L\n", i);
        if
        :: Lh == i + 1 -> ga[i] = 1
        :: else -> ga[i] = 2
        fi;
        canon()
    }
}

/* Its answer (for the lease it was sent for: a loss clears ga). L not ours: the lease is
 * lost (LossReason.LEASE_FORGOTTEN), no SET goes out; the instance contends again like
 * after any loss. L ours: the SET NEX goes out at once, in the same step (no await
 * between the answer and the send). */
inline get_answer(i) {
    d_step {
        ga[i] != 0 ->
        if
        :: ga[i] == 2 ->
            printf("%d: L is not ours at the store: lease forgotten\n", i);
            lose(i)
        :: ga[i] == 1 && !stp[i] -> ga[i] = 0; apply_nex(i)
        :: ga[i] == 1 && stp[i] -> skip      /* stopping: no renewal goes out */
        fi;
        ga[i] = 0;
        observe(); COMPACT; canon()
    }
}

/* The local deadline: the send time + TTL - MARGIN on the local clock, which lasts
 * TTL - MARGIN - DRIFT .. TTL - MARGIN + DRIFT ticks of real time. The model takes the
 * latest, as it takes the shortest lock delay: either only lets an instance drive more.
 * ND(i) is that deadline, counted from now. Nothing was applied to L since this request
 * (one request at a time; the other instance is refused while L is ours), so while L is
 * ours ND is its remaining time less MARGIN - DRIFT; once it expired, the answer is late. */
#ifdef NO_DEADLINE
#define ND(i) (TTL)
#else
#define ND(i) ((Lh == i + 1 && Lr > MARGIN - DRIFT) -> Lr - (MARGIN - DRIFT) : 0)
#endif

inline nex_answer(i) {
    d_step {
        na[i] != 0 ->
        if
        :: na[i] == 1 -> SEEN(i, 0)             /* L is ours */
        :: else -> skip
        fi;
        if
        :: na[i] == 1 && ND(i) > 0 && held[i] ->      /* renewed: the same lease */
            /* Through x: spin drops the "Lr" of ND's text when it is an inline's
             * argument. */
            x = ND(i); push(dl[i], x); x = 0; dbt[i] = 0;
#ifdef STORE
            push(tok[i], iss[i]);
#endif
            printf("%d: renewed, deadline in %d\n", i, dl[i])
        :: na[i] == 1 && ND(i) > 0 && !held[i] ->     /* a new lease */
            held[i] = 1; dl[i] = ND(i); gate[i] = 0; dbt[i] = 0;
#ifndef RECHECK_DELAY
            gw[i] = fr[i];
#endif
#ifdef STORE
            tok[i] = iss[i];
#endif
#ifdef WITNESS
            fresh[i] = restarted;
#endif
            printf("%d: acquired, deadline in %d, lock delay %d\n", i, dl[i], fr[i]);
            open_gate(i)
        /* Too late (LeasedLock._settle gives None): the code then also counts L as seen
         * held (a contender) or loses the lease (a renewal); leaving both out only lets
         * an instance drive more. */
        :: na[i] == 1 && ND(i) <= 0 -> printf("%d: answer too late\n", i)
        :: na[i] == 2 && held[i] ->                   /* a renewal refused: a loss */
            printf("%d: renewal refused\n", i);
            lose(i)
        :: na[i] == 2 && !held[i] ->                  /* Leadership.contend: seen held */
            printf("%d: refused\n", i);
            seen_other(i)
        fi;
        na[i] = 0;
        observe(); COMPACT; canon()
    }
}

inline deleted(i) {       /* L's DELETE, seen live (LockDelay.seen_released) */
    d_step {
        dn[i] -> dn[i] = 0; fr[i] = 0; SEEN(i, 0);
        printf("%d: sees L deleted\n", i); open_gate(i); observe(); canon()
    }
}

/* A fenced store write to either key: a point's value, the sync record (they ask
 * may_drive(), through Agent.may_write, and fenced_set a token: held, not in doubt), or
 * the takeover's fence of a key (PointSync.fence: read it and write it back with this
 * lease's token, NEX, before the points' workers start). The store fences a key by the
 * token of its last write, not by the lock: a late write of the former active is refused
 * on a key only once the new holder wrote it; (2') says when that is every key. Writes
 * may go in any order, which covers the fences first; the fence's read and write are one
 * step, and its NEX is left out (a value written in between is read and written back
 * once more): the token decides. One write on its way at a time: answers are left out,
 * so a write changes nothing for its sender; of several on their way, the first to arrive
 * does what an arrival can (a key present), the others only raise their keys' tokens. */
#ifdef STORE
inline write_key(i, k) {
    d_step {
        MAY_DRIVE(i) && conn[i] && wq[i] == 0 ->
        wq[i] = 1; wk[i] = tok[i]; wp[i] = k;
        printf("%d: sends a fenced write to key %d (token %d)\n", i, k, tok[i]); canon()
    }
}

inline write(i) {
    if
    :: write_key(i, 0)
    :: write_key(i, 1)
    fi
}
#else
/* The default check keeps only whether a sync record is in the store. Applied at once:
 * one sent while i may drive, confirmed, arrives while L is still i's at the store
 * (DELAY < MARGIN - DRIFT + 1), where it is there just the same. */
inline write(i) {
    d_step {
        MAY_DRIVE(i) && conn[i] && !rec ->
        rec = 1; printf("%d: writes a sync record\n", i); canon()
    }
}
#endif

/* SIGTERM (Agent._shutdown): stop writing; once the write on the line (and the store
 * write on its way, same connection) is done, VDEL L if it is ours, and exit. systemd
 * starts a fresh process: a new holder value, nothing held, not connected. The release
 * lets the other instance take over at once (its DELETE notification). */
inline stop(i) {
    d_step { !stp[i] -> stp[i] = 1; printf("%d: stopping\n", i); canon() }
}

inline restart_process(i) {
    conn[i] = 0; held[i] = 0; gate[i] = 0; gw[i] = 0; na[i] = 0; ga[i] = 0; dn[i] = 0;
    lk[i] = 0; stp[i] = 0; dbt[i] = 0; dl[i] = 0; fr[i] = 0;
#ifdef STORE
    tok[i] = 0;
#endif
#ifdef DROP_RULE
    fr[i] = LOCKDELAY - DRIFT; seen[i] = 0;
#endif
#ifdef WITNESS
    fresh[i] = 0;
#endif
#ifdef CHECK_THEN_WAIT
    wt[i] = 0;               /* a process that is gone sends nothing */
#endif
    COMPACT
}

inline exit_process(i) {
    d_step {
        stp[i] && QUIET(i) ->
        if
        :: gate[i] && held[i] && !dbt[i] && conn[i] && Lh == i + 1 ->
            printf("%d: releases L and exits\n", i);
            Lh = 0; Lr = 0;
            if :: conn[1 - i] -> dn[1 - i] = 1 :: else -> skip fi
        :: else ->
            printf("%d: exits\n", i);
            if :: Lh == i + 1 -> Lh = GONE :: else -> skip fi
        fi;
        restart_process(i);
        canon()
    }
}

/* A crash (SIGKILL): the process stops at once; L, if it is its, stays until it expires.
 * A write on the line or on its way to the store still completes. */
inline crash(i) {
    d_step {
        printf("%d: crashes\n", i);
        if :: Lh == i + 1 -> Lh = GONE :: else -> skip fi;
        restart_process(i);
        canon()
    }
}

#ifdef CHECK_THEN_WAIT
/* The bytes of a write that passed the gate, after its wait: not asked again. */
inline go_out(i) {
    d_step {
        wt[i] ->
        wt[i] = 0; md[i] = WDUR + 1;
        printf("%d: a write that waited goes out\n", i);
        assert(md[0] == 0 || md[1] == 0);
        canon()
    }
}
#endif

inline instance(i) {
    if
    :: connect(i)
    :: look(i)
    :: send_nex(i)
    :: send_get(i)
    :: get_answer(i)
    :: nex_answer(i)
    :: deleted(i)
    :: write(i)
#ifdef CHECK_THEN_WAIT
    :: go_out(i)
#endif
#ifndef NO_EXITS
    :: stop(i)
    :: exit_process(i)
#endif
    fi
}

/* ---------------------------------------------------------------- the store */

#ifdef STORE
inline apply_write(i) {
    d_step {
        wq[i] != 0 ->
#ifdef NO_FENCING
        if
        :: true ->
#else
        if
        :: Kt[wp[i]] == 0 || wk[i] >= Kt[wp[i]] ->
#endif
            printf("store: accepts %d's write to key %d (token %d)\n", i, wp[i], wk[i]);
#ifdef LONG_DELAY
            /* (2') no accepted write, on any key, carries a token older than that of
             * another holder that took over (with one key: than that of a write accepted
             * from another holder before) */
            assert(wk[i] >= tko[1 - i]);
#else
            /* (2) no accepted write carries a token older than one issued to another */
            assert(wk[i] >= iss[1 - i]);
#endif
            push(Kt[wp[i]], wk[i]);
#ifdef LONG_DELAY
            if   /* i's lease took over: its token is that of every key its takeover
                  * fences (FENCED), where from now on an older write is refused */
            :: ((FENCED & 1) == 0 || Kt[0] == wk[i]) && ((FENCED & 2) == 0 || Kt[1] == wk[i]) ->
                push(tko[i], wk[i])
            :: else -> skip
            fi;
#endif
            skip
#ifndef NO_FENCING
        :: else -> printf("store: rejects %d's write to key %d (token %d)\n", i, wp[i], wk[i])
#endif
        fi;
        wq[i] = 0; wk[i] = 0; wp[i] = 0;
        compact(); canon()
    }
}
#endif

/* ---------------------------------------------------------------- faults */

/* Any message on its way, or the link drops. (A lost answer, or one the client gave up
 * waiting for: it may send again at once, or any time later.) */
inline lose_message(i) {
    if
    :: d_step { na[i] != 0 -> na[i] = 0; canon() }
    :: d_step { ga[i] != 0 -> ga[i] = 0; canon() }
    :: d_step { dn[i] -> dn[i] = 0; canon() }
#ifdef STORE
    :: d_step { wq[i] != 0 -> wq[i] = 0; wk[i] = 0; wp[i] = 0; compact(); canon() }
#endif
    :: d_step { conn[i] -> drop(i); printf("%d: link drops\n", i); canon() }
#ifndef NO_EXITS
    :: crash(i)
#endif
    fi
}

/* The store restarts without its contents (it is hosted by the broker: every connection
 * drops, and what was on its way is lost). A restart that keeps them is link drops. */
inline store_restart() {
    d_step {
        printf("store: restarts\n");
        Lh = 0; Lr = 0;
        drop(0); drop(1);
#ifdef STORE
        Kt[0] = 0; Kt[1] = 0; wq[0] = 0; wk[0] = 0; wp[0] = 0; wq[1] = 0; wk[1] = 0; wp[1] = 0;
        compact();
#else
        rec = 0;
#endif
#ifdef WITNESS
        restarted = 1;
#endif
        skip; canon()
    }
}

/* ---------------------------------------------------------------- time */

inline tick_instance(i) {
    dec(fr[i]);
    dec(gw[i]);
#ifdef STORE
    if :: wq[i] != 0 -> wq[i]++ :: else -> skip fi;
#else
    dec(md[i]);
#endif
#ifndef NO_DEADLINE
    dec(dl[i]);
    if
    :: held[i] && dl[i] == 0 -> lose(i); drop_link(i)
    :: else -> skip
    fi;
#endif
    open_gate(i)
}

#ifdef STORE
#define DUE(i) (wq[i] > DELAY)    /* a write sent DELAY ticks ago arrives (or is lost) */
#else
#define DUE(i) false
#endif

inline tick() {
    d_step {
        !(DUE(0) || DUE(1)) ->
        printf("tick\n");
        if
        :: Lh != 0 ->
            Lr--;
            if
            :: Lr == 0 ->                       /* expired: deleted, DELETE notified */
                printf("store: L expires\n");
                Lh = 0;
                if :: conn[0] -> dn[0] = 1 :: else -> skip fi;
                if :: conn[1] -> dn[1] = 1 :: else -> skip fi
            :: else -> skip
            fi
        :: else -> skip
        fi;
        tick_instance(0);
        tick_instance(1);
        observe(); COMPACT; canon()
    }
}

active proctype pair() {
    do
    :: instance(0)
    :: instance(1)
#ifdef STORE
    :: apply_write(0)
    :: apply_write(1)
#endif
    :: tick()
    :: lose_message(0)
    :: lose_message(1)
#ifndef STORE_KEEPS
    :: store_restart()
#endif
    od
}

/*
 * poll_pace.h -- how long the peer data path's polling threads sleep between looks. MPI offers
 * nothing to sleep on, so an owner's thread looks for requests and a requester for its answer,
 * each sleeping between looks; a wake-up costs CPU whatever the sleep's length (scripts/cluster/wake_cost.c
 * measures it), so no thread spins, and each sleep is as long as the wait it covers allows. Included by the data path (monarch/cluster/datapath.c);
 * tests/unit/native/test_poll_pace.py runs the two rules against each other in virtual time.
 *
 * Requester: the first sleep is most of the answers' recent round trip (a moving average),
 * then a quarter of it (at least POLL_MIN_NS) doubling up to POLL_MAX_NS (where an answer is
 * often late, looking again from a quarter of the round trip wakes less than from POLL_MIN_NS).
 * Its estimate only shrinks toward the true round trip: a look too early is followed by one a
 * quarter later.
 *
 * Owner: after any work half the requests' recent gap (at least IDLE_MIN_NS), doubling up to
 * IDLE_MAX_NS (what an idle owner's answer waits at most); within HOT_NS of its last request
 * only up to that gap (at least HOT_IDLE_MAX_NS): an owner whose requests come seldom (the
 * read-ahead lane's batches, ms apart) looks about twice per request, not every 200 us.
 * A request an application's open waits on (WAITED) bounds the owner's sleeps to
 * WAITED_IDLE_MAX_NS for WAITED_HOT_NS after it. Without that bound the two rules feed each other:
 * a reader that waits for its answer sends its next request a round trip later, which the
 * owner takes for a wide gap and sleeps longer, which widens the round trip until a reader
 * waits milliseconds per open. The bound lasts 2 ms, not HOT_NS: a waiting reader asks again
 * sooner, and a longer bound makes a hinted epoch's few transparent misses keep the owner's
 * thread awake (docs/performance.md, "What the constants rest on").
 *
 * A fault's pages (PACE_PAGES: a mapping's thread stopped on them, its round trip the job's time,
 * and a PFS page's the alternative) are looked at tighter on both sides: the owner sleeps at most
 * PAGES_IDLE_MAX_NS for WAITED_HOT_NS after one, and the requester looks first at a quarter of
 * the round trip, then twice as late each time (more wake-ups, for a reader that would otherwise
 * read its page from the PFS).
 */
#ifndef MONARCH_POLL_PACE_H
#define MONARCH_POLL_PACE_H

#include <stdint.h>

#define POLL_MIN_NS 20000LL             /* a requester sleeps at least this long between looks, */
#define POLL_MAX_NS 500000LL            /* at most this (an answer comes in one owner's sleep) */
#define IDLE_MIN_NS 50000LL             /* the owner's thread sleeps this long after any work, ... */
#define IDLE_MAX_NS 1000000LL           /* ... doubling up to this (what an idle owner's answer waits at most) */
#define HOT_NS 50000000LL               /* within this of its last request an owner is being read from: */
#define HOT_IDLE_MAX_NS 200000LL        /* its sleeps stop doubling here (a reader's next request is near) */
#define WAITED_IDLE_MAX_NS 200000LL     /* within WAITED_HOT_NS of a request an open waits on, never pass this */
#define WAITED_HOT_NS 2000000LL         /* (a reader waiting on its answers asks again sooner than this) */
#define PAGES_IDLE_MAX_NS 30000LL       /* ... and of a fault's pages, this */
#define PACE_WAITED 1                   /* what a request asks of the owner's pace: an open waits on it, */
#define PACE_PAGES 2                    /* ... a fault waits on it */
#define SPAN_POLL_NS 1000000LL          /* a span's requester looks every 1 ms: its megabytes take 10 ms and more
                                         * to come, and a block stager has several waiting at once */
#define SPAN_PAGES_MAX (256 << 10)      /* ... but a span this small (a fault's pages) is looked at as a file's answer */

static inline int64_t pace_clamp(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* -- the requester: looks at its answer -------------------------------------------------- */
/* The first sleep after a request is posted, from the recent round trip ``rtt`` (0: none yet). */
static inline int64_t pace_first_look(int64_t rtt)
{
    return pace_clamp(rtt * 3 / 4, POLL_MIN_NS, POLL_MAX_NS);
}

/* ... for a fault's pages */
static inline int64_t pace_first_look_pages(int64_t rtt)
{
    return pace_clamp(rtt / 4, POLL_MIN_NS, POLL_MAX_NS);
}

/* The sleep after the one of ``slept`` ns found no answer (``first``: that was the first). */
static inline int64_t pace_next_look(int64_t slept, int64_t rtt, int first)
{
    return first ? pace_clamp(rtt / 4, POLL_MIN_NS, POLL_MAX_NS) : pace_clamp(slept * 2, POLL_MIN_NS, POLL_MAX_NS);
}

/* The round trip's moving average (weight 1/8) after an answer seen ``took`` ns after its post. */
static inline int64_t pace_round_trip(int64_t rtt, int64_t took)
{
    return rtt ? rtt + (took - rtt) / 8 : took;
}

/* -- the owner: looks for requests -------------------------------------------------------- */
struct owner_pace {
    int64_t idle;                       /* the next sleep */
    int64_t worked, last, gap;          /* the last work, the last request, between requests (weight 1/8) */
    int64_t waited_at;                  /* the last request an open waited on */
    int64_t pages_at;                   /* the last a fault waited on */
};

static inline void owner_pace_init(struct owner_pace *p)
{
    p->idle = IDLE_MIN_NS;
    p->worked = p->last = p->gap = 0;
    p->waited_at = p->pages_at = -WAITED_HOT_NS;
}

/* The longest an owner's sleep may be at ``now`` while requests waited on bound it (else 0). */
static inline int64_t owner_pace_bound(const struct owner_pace *p, int64_t now)
{
    return now - p->pages_at < WAITED_HOT_NS    ? PAGES_IDLE_MAX_NS
           : now - p->waited_at < WAITED_HOT_NS ? WAITED_IDLE_MAX_NS
                                                : 0;
}

/* Work done at ``now``: ``took`` requests answered (``waited``: PACE_* of those: one an open or a
 * fault waits on), or other work (sends reaped). The next sleep is p->idle. */
static inline void owner_pace_worked(struct owner_pace *p, int64_t now, int took, int waited)
{
    p->worked = now;
    if (took) {                         /* a long pause counts as 4 ms: the next burst is soon fast again */
        int64_t g = pace_clamp(p->last ? now - p->last : IDLE_MAX_NS, 0, 4 * IDLE_MAX_NS);
        p->gap = p->gap ? p->gap + (g - p->gap) / 8 : g;
        p->last = now;
    }
    if (waited & PACE_WAITED)
        p->waited_at = now;
    if (waited & PACE_PAGES)
        p->pages_at = now;
    int64_t bound = owner_pace_bound(p, now);
    p->idle = !bound ? pace_clamp(p->gap / 2, IDLE_MIN_NS, IDLE_MAX_NS)
                     : pace_clamp(p->gap / 2, bound < IDLE_MIN_NS ? bound : IDLE_MIN_NS, bound);
}

/* A sleep ended at ``now`` with nothing to do: the next one, p->idle. */
static inline void owner_pace_slept(struct owner_pace *p, int64_t now)
{
    int64_t bound = owner_pace_bound(p, now);
    int64_t cap = bound                      ? bound
                  : now - p->worked < HOT_NS ? pace_clamp(p->gap, HOT_IDLE_MAX_NS, IDLE_MAX_NS)
                                             : IDLE_MAX_NS;
    p->idle = pace_clamp(p->idle * 2, 0, p->idle > cap ? p->idle : cap);
}

#endif

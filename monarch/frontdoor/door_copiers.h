/* door_copiers.h -- what door_copiers.c gives the door's other parts: the copiers (threads that
 * copy a slow source's misses, first, and the read-ahead lane's files, as many at once as their
 * rule allows: inflight.h) and the read-ahead lane (front_door_read_ahead). Their state (struct
 * door_copiers, d->copiers; struct door_ahead, d->ahead) is under d->mu. Part of front_door.c's
 * one translation unit. */
#ifndef MONARCH_DOOR_COPIERS_H
#define MONARCH_DOOR_COPIERS_H

#include "inflight.h"                  /* the copies in flight toward the PFS */

#define COPIERS_MAX 256                /* copier threads at most: copies in flight (inflight.c's ``high``) */
#define AHEAD_WAIT_NS 50000000LL       /* the lane, out of room lent, waits this long for more ... */
#define AHEAD_WAITS 100                /* ... this many times in a row before it ends (a full tier) */

struct worker;
struct waiter;
struct door_copiers {
    struct inflight flow;              /* copies in flight toward the PFS: the lane keeps to its limit */
    struct worker *threads;            /* COPIERS_MAX of them, started as the work wants them ... */
    int cap;                           /* ... up to this many: what the descriptor limit allows (copiers_allowed) */
    int n, working, stop;              /* started, copying now, stopping */
    pthread_cond_t work_cv;            /* a copier may have work: a miss queued, a slot free, room lent */
    struct waiter *demand, **demand_tail;  /* the misses of a slow source, queued for a copier (first) */
    int ndemand;
};

struct door_ahead {                    /* the read-ahead lane: small files copied ahead of the reader */
    int asked, on, busy, end;          /* end: why it ended early (FRONT_DOOR_AHEAD_ENDED) */
    int waits, room_wait;              /* its waits for room lent in a row; waiting for it now */
    uint32_t n, next;                  /* it goes through index entries 1 to n; the next one, from 0 */
    uint32_t described, large;         /* listed files it described; of those, past its size */
    uint32_t wanted;                   /* an entry a peer wants (dp_take_wanted) that waits for room, or 0 */
    uint64_t copies;
};

struct door;
/* -- what the other parts call ---------------------------------------------------------- */
static int copiers_allowed(void);            /* how many the descriptor limit allows */
static void staff_locked(struct door *d);    /* copiers started and woken for the work waiting; under d->mu */
static void *copier_main(void *arg);
static void stop_copiers(struct door *d);    /* joined */
static void close_waiting(struct door *d);   /* the misses queued and the requests parked, closed */

#endif /* MONARCH_DOOR_COPIERS_H */

/* inflight.h -- what inflight.c (the rule of how many copies are in flight toward one source)
 * gives the door's other parts: its state, one per lane (the door's copiers: door_copiers.h; each
 * owner of the peer lane: door_peer.h), and the calls that feed it. Python's lanes reach the same
 * rule through front_door.h's inflight_* exports. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_INFLIGHT_H
#define MONARCH_DOOR_INFLIGHT_H

#define INFLIGHT_START 8
#define INFLIGHT_LOW 4                 /* fewer copies than this in flight are never tried */
#define INFLIGHT_PERIOD 0.25
#define INFLIGHT_GAIN 1.15
#define INFLIGHT_WARMUP 1
#define INFLIGHT_WINDOWS 2
#define INFLIGHT_REPROBE 16
#define GROW_LATENCY 2.0               /* a generation this much slower than the fastest: the source queues them
                                          (twice: a busy node's noise at 50 ms a copy stays well below it) */

struct inflight {
    int fixed, low, high, limit, peak;
    int phase;                         /* INFLIGHT_PHASES (front_door.h) */
    double recent;                     /* moving mean of a copy's seconds (weight 1/8), < 0: none yet */
    /* slow start: the generation under way and the first one's mean */
    uint32_t gen_done;
    double gen_seconds, best_latency;  /* the fastest generation's mean copy time */
    int gen_saturated;
    /* the window under way */
    double t0, seconds;
    uint32_t done;
    int saturated;
    /* the round under way: the base limit and its rate, the pool of counted windows */
    int base_limit, climbed, seen;
    double base_rate, pool_span;
    uint64_t pool_copies, judged;
    double last_rate;                  /* copies/s of the last judged window */
};

/* -- what the other parts call ---------------------------------------------------------- */
static void inflight_init(struct inflight *c, int fixed, int start, int low, int high);
static void inflight_completed(struct inflight *c, double seconds, double now);  /* a copy ended */
static void inflight_starved(struct inflight *c);  /* a slot had nothing to copy: this window does not count */
/* and front_door.h's inflight_limit, inflight_state (exported to Python too) */

#endif /* MONARCH_DOOR_INFLIGHT_H */

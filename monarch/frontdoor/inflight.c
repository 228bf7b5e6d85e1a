/* How many copies are in flight toward one source: the rule every lane of whole files obeys
 * (design principle 14; the blocks of a large file are paced in bytes, by
 * monarch/node/stage/read_pace.py). Included by front_door.c, whose read-ahead lane and misses it steers, and
 * called through ctypes by Python's stager (monarch/node/stage/concurrency.py), so the C lane and
 * the Python threads follow the same measurement.
 *
 * Little's law: copies in flight = rate x latency. A source whose latency stays flat as more
 * copies go out gives more files a second for each copy more; one whose latency grows with
 * them (a busy disk, the CPU, the source's own thread limit) gives no more. Two phases:
 *
 * - Slow start (as TCP's): from ``start``, the limit doubles after each generation of copies
 *   (``limit`` of them) whose mean time stayed within GROW_LATENCY of the fastest generation's.
 *   A generation lasts one latency, so at 50 ms a copy the lane is 128 deep in 0.2 s, at
 *   200 ms in 0.8 s; a local disk, whose copies queue for the cores, leaves it at once.
 * - Then rounds of measurement (a fast source of small files pays for no thread more than it needs): the current limit's rate
 *   (copies/s) over WINDOWS windows after WARMUP, then twice as many, kept while each doubling
 *   gives GAIN times the rate of the limit below; when the first doubling does not pay, half
 *   as many, taken while the limit above it does not give GAIN times its rate, down to
 *   ``low``. A window lasts PERIOD s or three mean copy times, and counts only if there was
 *   work for every slot (``inflight_starved`` says there was not). After REPROBE windows at
 *   the result a new round starts from it (a source's latency changes).
 */

#include "inflight.h"


static void inflight_init(struct inflight *c, int fixed, int start, int low, int high)
{
    memset(c, 0, sizeof *c);
    c->low = low < 1 ? 1 : low;
    c->high = high < c->low ? c->low : high;
    c->fixed = fixed > 0 ? fixed : 0;
    start = start > 0 ? start : INFLIGHT_START;
    c->limit = c->fixed ? c->fixed : start < c->low ? c->low : start > c->high ? c->high : start;
    c->peak = c->limit;
    c->phase = c->fixed ? P_SETTLED : P_START;
    c->recent = -1;
    c->t0 = -1;
    c->saturated = c->gen_saturated = 1;
}

static void inflight_move(struct inflight *c, int limit, int phase)
{
    c->limit = limit;
    if (limit > c->peak)
        c->peak = limit;
    c->phase = phase;
    c->seen = 0;
    c->pool_copies = 0;
    c->pool_span = 0;
}

static void inflight_down_or_settle(struct inflight *c, int base_limit)
{
    if (base_limit / 2 >= c->low)
        inflight_move(c, base_limit / 2, P_DOWN);
    else
        inflight_move(c, base_limit, P_SETTLED);
}

static void inflight_up_or_down(struct inflight *c)
{
    if (c->base_limit * 2 <= c->high)
        inflight_move(c, c->base_limit * 2, P_UP);
    else if (c->climbed)
        inflight_move(c, c->base_limit, P_SETTLED);
    else
        inflight_down_or_settle(c, c->base_limit);
}

static void inflight_judge(struct inflight *c, uint32_t copies, double span)
{
    double rate = copies / span;
    c->last_rate = rate;
    c->judged++;
    c->seen++;
    if (c->phase == P_SETTLED) {
        if (c->seen >= INFLIGHT_REPROBE)
            inflight_move(c, c->limit, P_MEASURE);
        return;
    }
    if (c->seen <= INFLIGHT_WARMUP)
        return;                        /* the copies started under the previous limit end */
    c->pool_copies += copies;
    c->pool_span += span;
    if (c->seen < INFLIGHT_WARMUP + INFLIGHT_WINDOWS)
        return;
    rate = c->pool_copies / c->pool_span;
    if (c->phase == P_MEASURE) {
        c->base_limit = c->limit;
        c->base_rate = rate;
        c->climbed = 0;
        inflight_up_or_down(c);
    } else if (c->phase == P_UP) {
        if (rate > c->base_rate * INFLIGHT_GAIN) {   /* the doubling paid: keep it, try the next */
            c->base_limit = c->limit;
            c->base_rate = rate;
            c->climbed = 1;
            inflight_up_or_down(c);
        } else if (c->climbed) {       /* the base itself paid over the limit below it: the top */
            inflight_move(c, c->base_limit, P_SETTLED);
        } else {
            inflight_down_or_settle(c, c->base_limit);
        }
    } else {                           /* P_DOWN */
        if (c->base_rate > rate * INFLIGHT_GAIN) {   /* the base pays over half as many: it stays */
            inflight_move(c, c->base_limit, P_SETTLED);
        } else {                       /* half as many give as much: take it, try fewer still */
            c->base_limit = c->limit;
            c->base_rate = rate;
            inflight_down_or_settle(c, c->limit);
        }
    }
}

/* Slow start: one generation (``limit`` copies) ended. */
static void inflight_generation(struct inflight *c)
{
    double mean = c->gen_seconds / c->gen_done;
    int saturated = c->gen_saturated;
    c->gen_done = 0;
    c->gen_seconds = 0;
    c->gen_saturated = 1;
    if (!saturated)
        return;                        /* a slot was free: this generation says nothing of the source */
    if (c->best_latency <= 0 || mean < c->best_latency) {
        c->best_latency = mean;
    } else if (mean > c->best_latency * GROW_LATENCY) {  /* the last doubling queued: back to where it did not */
        inflight_move(c, c->limit / 2 >= c->low ? c->limit / 2 : c->low, P_MEASURE);
        return;                        /* the rounds refine it from here */
    }
    if (c->limit < c->high)
        inflight_move(c, c->limit * 2 <= c->high ? c->limit * 2 : c->high, P_START);
    else
        inflight_move(c, c->limit, P_MEASURE);
}

/* One copy ended after ``seconds``, at ``now`` (seconds on the caller's monotonic clock). */
static void inflight_completed(struct inflight *c, double seconds, double now)
{
    c->recent = c->recent < 0 ? seconds : c->recent + (seconds - c->recent) / 8;
    if (c->fixed)
        return;
    if (c->phase == P_START) {
        c->gen_done++;
        c->gen_seconds += seconds;
        if (c->gen_done >= (uint32_t)c->limit) {
            inflight_generation(c);
            if (c->phase != P_START) {  /* the rounds begin with a fresh window */
                c->t0 = now;
                c->done = 0;
                c->seconds = 0;
                c->saturated = 1;
            }
        }
        return;
    }
    if (c->t0 < 0)
        c->t0 = now;
    c->done++;
    c->seconds += seconds;
    double span = now - c->t0, mean = c->seconds / c->done;
    if (span < INFLIGHT_PERIOD || span < 3 * mean || c->done < 4)
        return;
    if (c->saturated)
        inflight_judge(c, c->done, span);
    c->t0 = now;
    c->done = 0;
    c->seconds = 0;
    c->saturated = 1;
}

/* A slot was free and there was nothing to copy: the window says nothing of the source. */
static void inflight_starved(struct inflight *c)
{
    c->saturated = 0;
    c->gen_saturated = 0;
}

/* -- Python's side: a rule of its own per stager (ctypes) ---------------------------------- */
EXPORT struct inflight *inflight_new(int fixed, int start, int low, int high)
{
    struct inflight *c = malloc(sizeof *c);
    if (c)
        inflight_init(c, fixed, start, low, high);
    return c;
}

EXPORT void inflight_free(struct inflight *c) { free(c); }
EXPORT void inflight_copy_ended(struct inflight *c, double seconds, double now) { inflight_completed(c, seconds, now); }
EXPORT void inflight_nothing_to_copy(struct inflight *c) { inflight_starved(c); }
EXPORT int inflight_limit(const struct inflight *c) { return c->limit; }

EXPORT void inflight_state(const struct inflight *c, struct inflight_state *out)
{
    *out = (struct inflight_state){
        .limit = (uint64_t)c->limit,
        .peak = (uint64_t)c->peak,
        .windows_judged = c->judged,
        .phase = (uint64_t)c->phase,
        .mean_copy_seconds = c->recent,
        .last_rate = c->last_rate,
    };
}

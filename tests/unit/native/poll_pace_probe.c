/* poll_pace.h's rules exported for tests/unit/native/test_poll_pace.py (built by it). */
#include <stdlib.h>

#include "../../../monarch/native/poll_pace.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int64_t probe_first_look(int64_t rtt) { return pace_first_look(rtt); }
EXPORT int64_t probe_next_look(int64_t slept, int64_t rtt, int first) { return pace_next_look(slept, rtt, first); }
EXPORT int64_t probe_round_trip(int64_t rtt, int64_t took) { return pace_round_trip(rtt, took); }

EXPORT struct owner_pace *probe_owner_new(void)
{
    struct owner_pace *p = malloc(sizeof *p);
    if (p)
        owner_pace_init(p);
    return p;
}

EXPORT void probe_owner_free(struct owner_pace *p) { free(p); }
EXPORT void probe_owner_worked(struct owner_pace *p, int64_t now, int took, int waited) { owner_pace_worked(p, now, took, waited); }
EXPORT void probe_owner_slept(struct owner_pace *p, int64_t now) { owner_pace_slept(p, now); }
EXPORT int64_t probe_owner_idle(const struct owner_pace *p) { return p->idle; }

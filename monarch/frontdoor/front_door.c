/* The node daemon's front door: the hot path of its socket, in C, on threads of its own
 * (one per core, up to 4, or as many as asked up to MAX_WORKERS: a cluster's daemon asks for
 * more, since a worker waits on the network while it fetches another node's file; each with
 * its own epoll on the listening socket).
 *
 * Every connection is accepted here, its peer checked (SO_PEERCRED) and its request read.
 * The door answers the two requests that dominate a cold epoch without the Python
 * interpreter: an OPEN of a file already staged (its path), and an OPEN of a small file
 * not staged yet from a fast source, which it copies from the PFS into the first tier
 * itself (the Python stager's publish: a temporary name in the copy's directory, the
 * source's mtime and owner-only mode, a rename) before answering. Everything else (other
 * verbs, odd or partial frames, another uid, a key the Python stager owns, a failed copy)
 * is handed over to the Python server as the connection with the bytes already read: the
 * door never refuses a request and never decides policy (only a flood beyond HANDED_MAX
 * connections waiting for Python, or one arriving with no descriptor left, is closed unread).
 * While the snapshot walk runs, an INDEX poll (body INDEX_POLL) is answered here,
 * INDEX_WALKING, so a shim tells a daemon busy walking (its interpreter perhaps held for a
 * while by the walk's own work) from a lost one; once Python says the snapshot settled
 * (front_door_settle) polls are Python's, which knows whether it is ready or failed. A shim's
 * OPEN that asks to keep its connection (REQUEST_KEEP) is answered ANSWER_KEPT and its
 * connection kept, idle, for the shim's next OPEN, whichever thread
 * answered it (door_answers.c: finish_open); one handed over is Python's, which closes it.
 *
 * Python keeps the policy and the books. It tells the door which keys are staged where
 * (front_door_staged / front_door_forget), which keys it copies itself
 * (front_door_claim), how many tier bytes the door may fill (front_door_grant), and
 * whether it may copy at all (front_door_copying); it drains what the door copied
 * (front_door_events) into its own accounting. Whether the source is fast enough to copy
 * inline, and how many copies it keeps in flight, the door measures itself (inflight.c: as
 * many as hide the source's latency at the rate it gives): a miss from a fast source is
 * copied by the worker that read it, one from a slow source by the door's copiers, a pool of
 * threads that also run the read-ahead lane; a slow source is a reason for more copies in
 * flight, never for handing misses to Python. In a sharded cluster the door
 * copies only this node's own files (front_door_own_only: those ``owners`` gives to no other
 * node), and offers each copy to the C peer data path at once, so other nodes fetch it
 * without Python too. Two sets of books: the stager's (copies, lent room in the first tier)
 * and the peer cache's (fetches, lent room in the peer area), each with its own lease and
 * events (Q_BOOKS, Q_PEER). A key is in one state:
 * absent (never asked: the door may copy it), BUSY (the door copies it now), STAGED
 * (answerable), or PYTHON (anything else: handed over).
 *
 * The door's parts, one translation unit (the shim's way: every function static, one file
 * compiled). Each part declares in its own header what it gives the others (its functions, its
 * types, and the state it changes: a sub-struct of struct door); every header is included before
 * any part, so a part calls another's functions whatever the order they are included in:
 *   front_door.h       the contract with Python: events, reasons, the event record, the counters, the
 *                      API (the peer data path's types it calls: ../native/datapath.h; the routes:
 *                      the copy reads each file's in the index, the peer lane tests its row's size
 *                      and the owners: ../wire/monarch_wire.h)
 *   door.h             the door's state: a worker, struct door made of the parts' states, the counters
 *   front_door.c       (here) the small things every part uses
 *   inflight.[ch]      how many copies are in flight: the rule every lane of whole files follows
 *   door_keys.[ch]     the key table: every key the door has heard of, and its state (d->keys)
 *   door_index.[ch]    the snapshot's index, read in place (d->index)
 *   door_answers.[ch]  handing over to Python, the events of its books (d->answers, d->books), a
 *                      request's checks and answers, requests parked on a copy under way
 *   door_dirs.[ch]     a thread's directories of a tier, kept open by their path
 *   door_copies.[ch]   one copy from the PFS into the copy tier, published atomically
 *   door_sources.[ch]  the PFS side of a copy: a source opened (in its directory, kept open) and stat'ed
 *   door_peer.[ch]     the peer lane: another node's file through the C data path (d->peer)
 *   door_peer_ahead.[ch] the peer read-ahead lane: a hinted order's other nodes' files fetched
 *                      ahead, in batches per owner: its state (d->pa), ring of copies, gathering
 *   door_peer_lane.[ch] that lane's thread, its requests in flight, its exports
 *   door_copiers.[ch]  the copiers and the read-ahead lane (d->copiers.threads, d->ahead)
 *   door_loop.[ch]     the hot path: the OPEN decision (try_open) and each worker's event loop
 *   door_api.c         what Python calls (ctypes): front_door.h's exports
 * An OPEN: door_loop.c (on_accept -> on_readable -> serve -> try_open), then door_keys.c /
 * door_index.c (the key's state, its file), then an answer (door_answers.c), a copy
 * (door_copies.c), a fetch (door_peer.c) or a copier's turn (door_copiers.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "../wire/monarch_wire.h" /* frames, index layout, limits: one definition (tests/unit/test_wire.py) */
#include "../native/monarch_native.h" /* EXPORT, the clock, CRC-32, the index look-up: shared */
#include "../native/xxh64.h"         /* the ring hash of the placement (an entry's owner) */
#include "../native/poll_pace.h"     /* the looks at a fetch's answer (as the data path's own) */
#include "front_door.h"                /* events, reasons, the event record, what Python calls: the contract */

#ifndef F_ADD_SEALS                    /* an older glibc's headers predate memfd (the kernel has it) */
#define F_ADD_SEALS 1033
#endif
#if !defined(SYS_statx) && defined(__x86_64__)   /* headers older than the kernel (statx: Linux 4.11) */
#define SYS_statx 332
#elif !defined(SYS_statx) && defined(__aarch64__)
#define SYS_statx 291
#endif

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x1U
#define MFD_ALLOW_SEALING 0x2U
#endif

#ifndef EPOLLEXCLUSIVE
#define EPOLLEXCLUSIVE (1u << 28)          /* Linux 4.5; older headers lack the name */
#endif

#include "door.h"                      /* the door's state, and what each part gives the others (door_*.h) */
#include "door_peer_ahead.h"           /* the peer read-ahead lane's state (it holds a worker: after door.h) */

/* -- small things -------------------------------------------------------------------- */
static int write_full(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Milliseconds since the door started, from 1 (0: never), wrapping after 49 days: when a key
 * was answered, in 4 bytes of its slot. */
static uint32_t door_ms(const struct door *d)
{
    return (uint32_t)((monarch_now_ns() - d->started_ns) / 1000000) + 1;
}

/* Wait on ``cv`` (with ``mu`` held) until it is signalled or ``ns`` have passed. */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, long ns)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += ns;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &until);
}

/* -- the parts, in any order: each calls the others through their headers ------------- */
#include "inflight.c"
#include "door_keys.c"
#include "door_index.c"
#include "door_answers.c"
#include "door_dirs.c"
#include "door_copies.c"
#include "door_sources.c"
#include "door_owners.c"
#include "door_peer.c"
#include "door_peer_ahead.c"
#include "door_peer_lane.c"
#include "door_copiers.c"
#include "door_loop.c"
#include "door_pages.c"
#include "door_api.c"

/* door.h -- the front door's state, shared by its parts (front_door.c's one translation unit):
 * a worker (one thread of the door), the door itself, and the small things every part uses.
 *
 * The door is made of its parts' states, each a sub-struct declared in the header of the part
 * that changes it (door_keys.h: d->keys, door_index.h: d->index, door_answers.h: d->answers and
 * d->books, door_copiers.h: d->copiers and d->ahead, door_peer.h: d->peer, door_peer_ahead.h:
 * d->pa); what is left here is the door's own: its sockets and threads, its roots and tiers,
 * Python's switches, the keys under way, and the counters. One lock (d->mu) still guards every
 * part's state (a copy's publishing touches the keys, the books, the parked requests and the
 * copiers at once); the fields read or added to without it say so (atomic). */
#ifndef MONARCH_DOOR_H
#define MONARCH_DOOR_H

#include "inflight.h"
#include "door_keys.h"
#include "door_index.h"
#include "door_answers.h"
#include "door_dirs.h"
#include "door_copies.h"
#include "door_sources.h"
#include "door_owners.h"
#include "door_peer.h"
#include "door_copiers.h"
#include "door_loop.h"
#include "door_peer_lane.h"
#include "door_pages.h"

#define MAX_ROOTS 64
#define CORE_WORKERS 4                 /* threads, one per core up to this: the copies are kernel time */
#define MAX_WORKERS 16                 /* threads when asked for (front_door_start's ``workers``) */

struct worker {                        /* one thread of the door: its own epoll and buffers */
    struct door *d;
    pthread_t thread;
    int ep;
    struct conn *pending;
    int npending;
    uint64_t tmp_seq;
    char *copy_buf;
    int spare_fd;                      /* /dev/null held back: given up to refuse a connection when
                                          the process is out of descriptors, or -1 */
    /* the directories of the last copy (door_copies.c: copy_in): the next file is most often a neighbour */
    int src_dir, key_dir;              /* its source directory, its directory in the copy tier, or -1 */
    int key_dir_slot;                  /* the copy tier ``key_dir`` is in */
    int src_fresh;                     /* an open in ``src_dir`` leaves the file's attributes fresh */
    int listed_src;                    /* a listed file's source, opened to describe it: the copy's (or -1) */
    uint32_t ahead_held;               /* the lane's entry it described so (from 1), not taken yet, or 0 */
    uint32_t src_dir_len, key_dir_len; /* the key's directory part they were opened for */
    char src_dir_key[PATH_MAX], key_dir_key[PATH_MAX];
    uint32_t last_dir_len;             /* the last source's directory part, its directory not opened: a */
    char last_dir_key[PATH_MAX];       /* second key there in a row opens it (a reader in order's) */
    struct dir_cache peer_dirs;        /* its directories in the peer area (door_dirs.h) */
    /* the memfds this worker answers remote opens with, kept with their pages (door_peer.c) */
    int pool[PEER_POOL];               /* read-write opens, the pool's own */
    int npool, pool_next, pool_off;
    int fetching;                      /* in run_owner: the opens it reads meanwhile wait in their queues (under the lock) */
    int stopping;                      /* it saw the stop while an answer was due: sleeps, no more serving */
    int waiting;                       /* serving its connections while an answer is due (wait_serving) */
};

struct door_counters {                 /* front_door_counts' (the peer lane's: d->peer) */
    uint64_t hits[MONARCH_MAX_SLOTS];  /* opens answered with a staged copy, by slot (atomic) */
    uint64_t copies, failures, bytes_read;  /* door_copies.c */
    uint64_t handed, why[R_REASONS], closed_too_many;  /* door_answers.c: connections handed over, by reason */
    uint64_t accepted, reused;         /* door_loop.c: connections accepted; requests read on a kept one */
};

struct door {
    /* set by front_door_start, then read alone */
    int listen_fd, stop_fd, wake_fd;
    uid_t uid;
    struct worker workers[MAX_WORKERS];
    int nworkers;
    int64_t started_ns;                /* door_ms counts from here */
    char *roots[MAX_ROOTS];
    int nroots;
    int root_fresh[MAX_ROOTS];         /* an open under root k leaves attributes fresh: 1, 0, -1 not asked yet */
    char *tiers[MONARCH_MAX_SLOTS];    /* slot -> tier directory (NULL: none) */
    int copy_slot;
    struct {                           /* each root's routes by size (front_door_describe_with): a file a listing-mode
                                        * walk left undescribed is described by the door at its miss, its route published */
        uint64_t smallest[MAX_ROOTS * MONARCH_ROUTE_STEPS];
        uint8_t route[MAX_ROOTS * MONARCH_ROUTE_STEPS];
        int nsteps[MAX_ROOTS];
        int nroots;
        int known;                     /* set once (release), before the index is lent */
    } steps;
    pthread_mutex_t mu __attribute__((aligned(64)));  /* everything below, the parts' states included
                                          (on a cache line of its own: not the counters') */
    pthread_cond_t cv;                 /* a BUSY key is done */
    /* Python's switches (door_api.c) */
    int settled;                       /* the snapshot is ready or failed: INDEX polls are Python's */
    int gate_open, allowed, never_copy;  /* copying: Python allows it, no write by the job seen */
    int stopped;
    /* the keys under way */
    int busy;                          /* keys BUSY now */
    int copies_busy;                   /* of which copies from the PFS (front_door_copy_to waits for none) */
    /* the parts' */
    struct door_keys keys;             /* door_keys.h */
    struct door_index index;           /* door_index.h */
    struct door_sources sources;       /* door_sources.h: its own lock */
    struct door_answers answers;       /* door_answers.h */
    struct door_books books;           /* door_answers.h */
    struct door_copiers copiers;       /* door_copiers.h */
    struct door_ahead ahead;           /* door_copiers.h */
    struct door_peer peer;             /* door_peer.h */
    struct door_pages pages;           /* door_pages.h */
    struct peer_ahead *pa;             /* door_peer_ahead.h: made with its first order, or NULL */
    /* the counters every worker adds to without the lock: on cache lines of their own, away from it */
    struct door_counters count __attribute__((aligned(64)));
};

/* -- small things (front_door.c) ------------------------------------------------------ */
static int write_full(int fd, const char *p, size_t n);
static uint32_t door_ms(const struct door *d);  /* ms since the door started, from 1 (0: never) */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, long ns);

#endif /* MONARCH_DOOR_H */

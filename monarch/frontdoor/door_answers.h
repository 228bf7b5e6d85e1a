/* door_answers.h -- what door_answers.c gives the door's other parts: handing a connection over
 * to Python (struct door_answers: the queue Python takes from, d->answers), the events of
 * Python's two sets of books and the room they lend (struct door_books, d->books), a request's
 * checks and answers, connections kept for their shim's next OPEN, and requests answered later
 * (parked on a copy under way). Part of front_door.c's one translation unit; its state is under
 * d->mu, but for the events handed out (d->books.take_mu). */
#ifndef MONARCH_DOOR_ANSWERS_H
#define MONARCH_DOOR_ANSWERS_H

#include "door_index.h"                /* struct idx_file, in a waiter */

#define HANDED_MAX 4096                /* connections waiting for Python to take them (server.py's
                                          MAX_CONNECTIONS); beyond, closed at once: the shim reads the PFS */
#define KEPT_MAX 4096                  /* idle connections kept for their shim's next OPEN (REQUEST_KEEP):
                                          one per application thread; beyond, closed once answered */
#define EVENT_BATCH 256                /* copies reported per wake-up of Python, at most */
#define EVENT_HEAD ((int)sizeof(struct front_door_event_head))  /* front_door.h: the record head */
#define EVENTS_KEPT (1u << 20)         /* an event buffer larger than this is freed once drained */

struct conn {                          /* a connection whose request has not all arrived, or kept idle
                                          (``kept``: on the door's list, in a worker's epoll, not swept) */
    int fd;
    int kept;
    uint32_t got;
    int64_t since;
    struct conn *prev, *next;
    char buf[MONARCH_REQUEST_HEADER_SIZE + MONARCH_MAX_REQUEST];
};

struct handed {                        /* a connection for Python, with what was read */
    struct handed *next;
    int fd;
    uint32_t len;
    char data[];
};

/* A request answered later: an OPEN of a key another thread copies now (parked until that
 * copy ends), or a miss queued for a copier (``f``: its file). */
struct waiter {
    struct waiter *next;
    int fd;
    uint32_t hash, len, got;           /* the key's hash and length; the request's bytes in ``req`` */
    struct idx_file f;
    int to_area;                       /* a remote open: fetched into the peer area (1) or a memfd (door_peer.c) */
    int listed_src;                    /* a listed file's source, opened to describe it: the copier's (or -1) */
    char req[];                        /* the request as read: the key after its header */
};

/* One set of books' events, oldest first, packed as front_door_events hands them over (no
 * allocation per event: a copy's publishing holds the door's lock, which the lane's threads
 * wait for). The door appends to ``buf`` under the lock; a reader takes the whole of it at
 * once (swapped with its emptied ``out``) and hands it over outside the lock. */
struct evqueue {
    char *buf;                         /* under d->mu */
    size_t len, cap;
    int n;                             /* events in buf */
    char *out;                         /* taken, not yet handed over: under d->books.take_mu */
    size_t out_len, out_off, out_cap;
};

struct door_books {                    /* Python's books, by FRONT_DOOR_BOOKS (Q_*) */
    int64_t lease[NQUEUES];            /* room lent: a copy or fetch takes its size, Python grants more */
    int64_t low_water[NQUEUES];        /* wake Python below this */
    struct evqueue evq[NQUEUES];
    pthread_mutex_t take_mu;           /* front_door_events' (before d->mu, never after) */
};

struct door_answers {
    struct handed *hq, **hq_tail;      /* connections for Python (front_door_take) */
    int nhanded;                       /* of them */
    int woken;                         /* Python woken (wake_fd), not drained since */
    struct conn *kept;                 /* idle connections kept for their next OPEN */
    int nkept, keeping;                /* how many (with those being answered with ANSWER_KEPT); 0: stopping */
    struct waiter *parked;             /* OPENs of a BUSY key, answered when its copy or fetch ends */
};

struct door;
/* -- what the other parts call ---------------------------------------------------------- */
/* handing over to Python, and its books (the _locked ones under d->mu) */
static void wake_python_locked(struct door *d);
static void hand_over(struct door *d, int fd, const char *data, uint32_t len, int why);  /* why: R_* */
static void post_event_locked(struct door *d, int q, uint32_t kind, uint32_t slot, const char *key, uint32_t len,
                              uint32_t entry, uint64_t size, uint64_t bytes_read, int64_t ns);
/* a request, checked and answered */
static int valid_key(const char *k, uint32_t n);
static int send_answer(int fd, int32_t status, const char *body, uint32_t len);
static int arm_once(int ep, int fd, struct conn *c, int registered);
static int asks_keep(const char *req);
static int keep_locked(struct door *d, int asks);
static void finish_open(struct door *d, int fd, int keep, int sent);
static int answer_open(struct door *d, int fd, const char *req, int32_t status, const char *body, uint32_t len);
/* answers given later */
static struct waiter *new_waiter(int fd, const char *req, uint32_t got, uint32_t hash, uint32_t len);
static struct waiter *unpark_locked(struct door *d, const char *key, uint32_t len, uint32_t hash);
static void answer_parked(struct door *d, struct waiter *ready, int slot, const char *path);

#endif /* MONARCH_DOOR_ANSWERS_H */

/* door_loop.h -- what door_loop.c (the hot path: the OPEN decision, a request's frame, each
 * worker's event loop) gives the door's other parts: the thread a worker runs, and its loop's
 * turn for a worker that waits on a fetch. It owns no state of the door's beyond its workers'
 * (struct worker: door.h); it counts connections in d->count. Part of front_door.c's one
 * translation unit. */
#ifndef MONARCH_DOOR_LOOP_H
#define MONARCH_DOOR_LOOP_H

#define INLINE_COPY_SECONDS 0.0005     /* copies this fast (their moving mean) are made by the worker that
                                          read the miss; slower, by a copier (stager.INLINE_SECONDS) */
#define PENDING_MAX 1024               /* connections waiting here for their request at once ... */
#define PENDING_NS 500000000LL         /* ... for this long; then Python (and its deadline) has them */
enum { T_LISTEN = 1, T_STOP = 2 };     /* what an epoll event's data names, but a connection */
/* what a request's bytes are (frame_state; door_pages.c's pages_frame for a PAGES) */
enum { F_MORE, F_OPEN, F_ODD, F_INDEX_POLL, F_HINT_PROGRESS, F_PAGES, F_DESCRIBE };

struct worker;
struct epoll_event;
/* -- what the other parts call ---------------------------------------------------------- */
static void *door_main(void *arg);     /* a worker's thread (front_door_start) */
/* ``n`` events of the worker's epoll served; 1: the stop came (door_peer.c's wait for an answer) */
static int serve_events(struct worker *w, const struct epoll_event *evs, int n);

#endif /* MONARCH_DOOR_LOOP_H */

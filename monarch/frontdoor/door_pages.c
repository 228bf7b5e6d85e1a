/* Part of front_door.c, one translation unit (what it gives the other parts: door_pages.h). Here:
 * a shim's PAGES. A random reader's guarded fault on another owner's block, in a window (a
 * cluster's file larger than the node's room), asks for the page it touched and a few after it
 * (the shim's shim_pages.c): the worker fetches them from the owner the shim names (the block
 * map's owners) with the data path's dp_fetch_pages, which the owner answers from its copy only
 * where those blocks are STAGED there (else handed back: refused here, the shim reads the PFS).
 * The worker answers on its own thread, as it answers a remote open (the fetch is a round trip on
 * the peer plane), and keeps the connection for the thread's next fault. */
#include "door_pages.h"

_Static_assert(MONARCH_ANSWER_HEADER_SIZE + MONARCH_PAGES_MAX <= MONARCH_INLINE_MAX, "a PAGES answer fits a worker's copy_buf");

static int pages_frame(const char *buf, uint32_t got, uint32_t length)
{
    uint32_t least = (uint32_t)sizeof(struct monarch_pages_request) + 1;
    if (((unsigned char)buf[1] & ~MONARCH_REQUEST_KEEP) || buf[2] || buf[3] || length < least
        || length > MONARCH_MAX_REQUEST || got > MONARCH_REQUEST_HEADER_SIZE + length)
        return F_ODD;
    return got < MONARCH_REQUEST_HEADER_SIZE + length ? F_MORE : F_PAGES;
}

static void serve_pages(struct worker *w, int fd, const char *req, uint32_t got)
{
    struct door *d = w->d;
    struct monarch_pages_request pr;
    memcpy(&pr, req + MONARCH_REQUEST_HEADER_SIZE, sizeof pr);
    const char *key = req + MONARCH_REQUEST_HEADER_SIZE + sizeof pr;
    uint32_t klen = got - MONARCH_REQUEST_HEADER_SIZE - (uint32_t)sizeof pr;
    pthread_mutex_lock(&d->mu);
    struct door_pages p = d->pages;
    pthread_mutex_unlock(&d->mu);
    int ok = p.fetch_pages && pr.owner >= 0 && pr.owner != p.self_node && pr.length > 0
             && pr.length <= MONARCH_PAGES_MAX && pr.offset < pr.size && pr.length <= pr.size - pr.offset
             && valid_key(key, klen);
    char *frame = w->copy_buf;         /* (MONARCH_INLINE_MAX: a frame of PAGES_MAX fits) */
    ok = ok && p.fetch_pages(p.dp, pr.owner, key, (int)klen, pr.size, pr.mtime_ns, pr.offset, pr.length,
                             frame + MONARCH_ANSWER_HEADER_SIZE, p.timeout_ms) == (int64_t)pr.length;
    pthread_mutex_lock(&d->mu);
    int keep = ok && keep_locked(d, asks_keep(req));
    pthread_mutex_unlock(&d->mu);
    int32_t status = ok ? (keep ? MONARCH_ANSWER_KEPT : 0) : MONARCH_STATUS_ERROR;
    uint32_t len = ok ? pr.length : 0;
    memcpy(frame, &status, 4);
    memcpy(frame + 4, &len, 4);
    ssize_t sent = send(fd, frame, MONARCH_ANSWER_HEADER_SIZE + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    finish_open(d, fd, keep, sent == (ssize_t)(MONARCH_ANSWER_HEADER_SIZE + len));
}

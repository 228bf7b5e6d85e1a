/* door_pages.h -- what door_pages.c (a shim's PAGES: a guarded fault's pages of another owner's
 * block, fetched from that owner through the C data path) gives the door's other parts: its
 * state (d->pages, under d->mu) and the request's frame and answer. Part of front_door.c's one
 * translation unit. */
#ifndef MONARCH_DOOR_PAGES_H
#define MONARCH_DOOR_PAGES_H

struct door_pages {
    dp_fetch_pages_fn *fetch_pages;    /* the data path's dp_fetch_pages (front_door_pages), or NULL: refused */
    struct dp *dp;
    int self_node, timeout_ms;
};

struct worker;
/* ``got`` bytes of a PAGES request (its header read): not all there yet, whole, or odd (F_*) */
static int pages_frame(const char *buf, uint32_t got, uint32_t length);
/* A whole PAGES request answered: the bytes, or STATUS_ERROR (the shim reads the PFS) */
static void serve_pages(struct worker *w, int fd, const char *req, uint32_t got);

#endif /* MONARCH_DOOR_PAGES_H */

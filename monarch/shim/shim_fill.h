/* shim_fill.h -- what shim_fill.c (an application's large read of blocks not staged fills the
 * copy) gives the shim's other parts. Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_FILL_H
#define MONARCH_SHIM_FILL_H

#define MONARCH_FILL_MIN (4u << 20) /* a read this large fills the copy with its blocks (any read in order) */

/* ---- what the other parts call ---- */
static int monarch_part_fill(int fd, struct monarch_part *pt, void *buf, size_t n, off_t o, int at_offset,
                             size_t min, ssize_t *out);

#endif /* MONARCH_SHIM_FILL_H */

/* shim_stdio.h -- what shim_stdio.c (a FILE of a file staged by blocks, made with fopencookie:
 * its reads are the shim's) gives the shim's other parts. Part of monarch_shim.c's one
 * translation unit. */
#ifndef MONARCH_SHIM_STDIO_H
#define MONARCH_SHIM_STDIO_H

struct monarch_stdio; /* a FILE of the shim's: its descriptor, offsets and buffer */

/* ---- what the other parts call ---- */
static FILE *monarch_stdio_file(int fd, const char *mode);
static struct monarch_stdio *monarch_stdio_of(FILE *fp);
static void monarch_stdio_reopened(struct monarch_stdio *s);

#endif /* MONARCH_SHIM_STDIO_H */

/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_stdio.h).
 * Here: a FILE of a file staged by blocks.
 *
 * stdio reads a FILE made by glibc's fopen or fdopen through its internal __read, which no
 * preload sees: md5sum, sha256sum or a C loader's fread of a large file would read the PFS
 * while the daemon copies the same blocks beside it (the PFS read twice), and never the copy.
 * So fopen and fdopen of a descriptor of a file staged by blocks, for reading, answer a FILE of
 * glibc's fopencookie whose read, seek and close are the shim's: a read is the descriptor's
 * read() as the application's own would be (its staged blocks from the copy, a sequential
 * run's blocks not staged filled into the copy, shim_fill.c), counted as read() is.
 *   - The descriptor is the FILE's own: fileno() answers it (the FILE's _fileno, a public
 *     field of glibc's FILE; fopencookie leaves it negative), so fstat, posix_fadvise and mmap
 *     of fileno(fp) work as with a plain FILE (od -j, md5sum's fadvise, loaders that size the
 *     file by fstat); reads move its offset, and fseek is its lseek, as stdio's own.
 *   - The buffer is the PFS's st_blksize, at least MONARCH_STDIO_BUF (a plain FILE's is the
 *     st_blksize alone; stdio refills a cookie's buffer whole, never reading around it).
 *   - A refill after a seek away from where the last read ended reads st_blksize (what a plain
 *     FILE reads there), the next ones in order twice as much each, up to the buffer: a random
 *     reader of records costs the PFS about what it did, a reader going on reads whole buffers.
 *   - Never unbuffered (setvbuf _IONBF, setbuf NULL: shim_wrappers.c): a cookie's FILE refills
 *     its buffer whole for every fread, so unbuffered it would read a byte per call.
 *   - Not wide-oriented: fgetwc and kin read nothing from it (glibc's cookie FILEs are byte
 *     streams); a mode with ",ccs=" keeps the plain FILE.
 * Any failure (no memory, fopencookie refused): the plain FILE, which reads the PFS.
 */
#include "shim_stdio.h"

#define MONARCH_STDIO_BUF (128u << 10)      /* a FILE's buffer at least (cat's read size) */
#define MONARCH_STDIO_BUF_MAX (4u << 20)    /* and at most, whatever the PFS's st_blksize */

struct monarch_stdio {
    int fd;
    FILE *fp;
    uint64_t pos;         /* the descriptor's offset as the FILE moved it */
    uint64_t next;        /* where the FILE's last read ended: a read from there is sequential */
    size_t seek_read;     /* what a read after a seek asks for (the PFS's st_blksize) */
    size_t ask;           /* what the next read in order asks for at most (doubling up to len) */
    size_t len;           /* the buffer's */
    char buf[];           /* the FILE's buffer */
};

/* The FILE made on a descriptor (0: none), so that fread's wrapper does not count its bytes a
 * second time and freopen can let it go. */
static struct monarch_stdio *monarch_fd_stdio[MONARCH_MAX_FDS];

static ssize_t monarch_stdio_read(void *cookie, char *buf, size_t n)
{
    struct monarch_stdio *s = cookie;
    int fd = s->fd;
    ssize_t r = 0;
    monarch_blocks_resume();
    if (s->pos != s->next)
        s->ask = s->seek_read;
    if (n > s->ask)
        n = s->ask;
    s->ask = s->ask < s->len / 2 ? s->ask * 2 : s->len;
    if (!(monarch_part_of(fd) && monarch_part_read(fd, buf, n, &r))) {
        monarch_part_reads_pfs(fd);
        r = (ssize_t)syscall(SYS_read, fd, buf, n); /* the PFS's, counted as the read wrapper does */
        if (r > 0) {
            monarch_count_bytes(fd, (uint64_t)r);
            monarch_part_pfs_bytes(fd, r);
        }
    }
    if (r > 0)
        s->next = s->pos += (uint64_t)r;
    return r;
}

static int monarch_stdio_seek(void *cookie, off64_t *off, int whence)
{
    struct monarch_stdio *s = cookie;
    off64_t r = (off64_t)syscall(SYS_lseek, s->fd, (long)*off, whence);
    if (r < 0)
        return -1;
    *off = r;
    s->pos = (uint64_t)r;
    return 0;
}

/* The FILE's end: the descriptor closed as the application's close() would close it. */
static int monarch_stdio_close(void *cookie)
{
    struct monarch_stdio *s = cookie;
    int fd = s->fd;
    if ((unsigned)fd < MONARCH_MAX_FDS)
        __atomic_compare_exchange_n(&monarch_fd_stdio[fd], &s, NULL, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    free(cookie);
    return close(fd);
}

/* Is fp a FILE of ours? */
static struct monarch_stdio *monarch_stdio_of(FILE *fp)
{
    if (!fp)
        return NULL;
    int saved = errno, fd = fileno(fp);
    errno = saved;
    struct monarch_stdio *s =
        (unsigned)fd < MONARCH_MAX_FDS ? __atomic_load_n(&monarch_fd_stdio[fd], __ATOMIC_RELAXED) : NULL;
    return s && s->fp == fp ? s : NULL;
}

/* A FILE reading fd (a descriptor of a file staged by blocks, open for reading) through the
 * shim's reads, or NULL (then the caller makes the plain one; errno untouched). */
static FILE *monarch_stdio_open(int fd, const char *mode)
{
    struct stat st;
    if (!monarch_part_of(fd) || (unsigned)fd >= MONARCH_MAX_FDS || !mode || strchr(mode, ',')
        || monarch_fopen_flags(mode) < 0 || monarch_sys_fstat(fd, &st) != 0)
        return NULL;
    int saved = errno;
    off_t at = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR);
    size_t blk = st.st_blksize > 0 ? (size_t)st.st_blksize : 4096;
    size_t len = blk < MONARCH_STDIO_BUF ? MONARCH_STDIO_BUF : blk > MONARCH_STDIO_BUF_MAX ? MONARCH_STDIO_BUF_MAX
                                                                                            : blk;
    struct monarch_stdio *s = at < 0 ? NULL : malloc(sizeof *s + len);
    FILE *fp = NULL;
    if (s) {
        *s = (struct monarch_stdio){.fd = fd, .pos = (uint64_t)at, .next = (uint64_t)at,
                                    .seek_read = blk < len ? blk : len, .ask = len, .len = len};
        cookie_io_functions_t io = {.read = monarch_stdio_read, .seek = monarch_stdio_seek,
                                    .close = monarch_stdio_close};
        fp = fopencookie(s, "r", io);
    }
    if (fp) {
        MONARCH_RESOLVE(setvbuf)(fp, s->buf, _IOFBF, len); /* (refused: stdio's own, a plain FILE's size) */
        fp->_fileno = fd; /* fileno(): the descriptor (fopencookie leaves -2: "no file") */
        s->fp = fp;
        __atomic_store_n(&monarch_fd_stdio[fd], s, __ATOMIC_RELAXED);
        MONARCH_DEBUG(1, "fd %d: a FILE reading its staged blocks (a buffer of %zu bytes)", fd, len);
    } else {
        free(s);
    }
    errno = saved;
    return fp;
}

/* A FILE of ours reopened by freopen: glibc closed it without our close (it keeps the
 * descriptor's number for the file it opened in its place, inside glibc: the PFS's, unseen),
 * so the number is forgotten and the cookie (read and seek until then) freed now. The FILE is
 * glibc's plain one from then on, a byte stream (its wide side was the cookie's: none). */
static void monarch_stdio_reopened(struct monarch_stdio *s)
{
    int fd = s->fd, saved = errno;
    __atomic_store_n(&monarch_fd_stdio[fd], NULL, __ATOMIC_RELAXED);
    monarch_forget(fd);
    free(s);
    errno = saved;
}

/* fopen's and fdopen's FILE on fd (open for reading, by the shim or the application): ours when
 * fd is a file staged by blocks, else glibc's, which reads with its internal __read (its bytes
 * not all seen); NULL when neither can be made (fd left open). */
static FILE *monarch_stdio_file(int fd, const char *mode)
{
    FILE *fp = monarch_guard ? NULL : monarch_stdio_open(fd, mode);
    if (fp)
        return fp;
    fp = MONARCH_RESOLVE(fdopen)(fd, mode);
    if (fp)
        monarch_mark_uncounted(fd, MONARCH_UNSEEN_STDIO);
    return fp;
}

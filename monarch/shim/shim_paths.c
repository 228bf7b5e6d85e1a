/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_paths.h). Here:
 * paths: the absolute form and the key of a path, as the kernel resolves it. */
#include "shim_paths.h"

/* ---- paths ---- */

/* Lexically normalize an absolute path in place ('.', '..', '//'); returns its length. */
static size_t monarch_normalize(char *p)
{
    size_t r = 0, w = 0;
    while (p[r]) {
        while (p[r] == '/')
            r++;
        if (!p[r])
            break;
        size_t s = r;
        while (p[r] && p[r] != '/')
            r++;
        size_t len = r - s;
        if (len == 1 && p[s] == '.')
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (w > 0 && p[w - 1] != '/')
                w--;
            if (w > 0)
                w--;
            continue;
        }
        p[w++] = '/';
        memmove(p + w, p + s, len);
        w += len;
    }
    if (w == 0)
        p[w++] = '/';
    p[w] = '\0';
    return w;
}

/* Does the path have a ".." component? */
static int monarch_has_dotdot(const char *p)
{
    for (const char *c = strstr(p, ".."); c; c = strstr(c + 1, ".."))
        if ((c == p || c[-1] == '/') && (c[2] == '\0' || c[2] == '/'))
            return 1;
    return 0;
}

/* Is the absolute path p its own normal form (no empty, "." or ".." component, no trailing
 * '/')? One pass, so that most opens skip monarch_has_dotdot and monarch_normalize. */
static int monarch_is_clean(const char *p)
{
    for (const char *c = p; (c = strchr(c, '/')) != NULL; c++) {
        if (c[1] == '/' || (c[1] == '\0' && c != p))
            return 0;
        if (c[1] == '.' && (c[2] == '/' || c[2] == '\0' || (c[2] == '.' && (c[3] == '/' || c[3] == '\0'))))
            return 0;
    }
    return 1;
}

/*
 * The absolute form of (dirfd, path) into out[PATH_MAX], as the kernel will
 * look it up; -1 if unknown. Without "..": lexical. With "..": the directory
 * part through realpath() (symlinks followed, as the kernel does before it
 * applies ".."), then the last component unresolved (open follows it, unlink
 * and rename do not; either way the key names what the call names).
 */
static int monarch_abspath(int dirfd, const char *path, char *out, size_t *lenp)
{
    size_t n = 0;
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(out, PATH_MAX))
                return -1;
            n = strlen(out);
        } else {
            char link[32] = "/proc/self/fd/";
            char digits[12];
            size_t d = 0, l = strlen(link);
            unsigned v = (unsigned)dirfd;
            if (dirfd < 0)
                return -1;
            do {
                digits[d++] = (char)('0' + v % 10);
                v /= 10;
            } while (v);
            while (d)
                link[l++] = digits[--d];
            link[l] = '\0';
            ssize_t k = readlink(link, out, PATH_MAX - 1);
            if (k <= 0 || out[0] != '/')
                return -1;
            n = (size_t)k;
        }
        out[n++] = '/';
    }
    size_t plen = strlen(path);
    if (n + plen >= PATH_MAX)
        return -1;
    memcpy(out + n, path, plen + 1);
    if (MONARCH_LIKELY(monarch_is_clean(out))) { /* most paths: already the normal form */
        *lenp = n + plen;
        return 0;
    }
    if (MONARCH_UNLIKELY(monarch_has_dotdot(out))) {
        char dir[PATH_MAX];
        size_t e = n + plen;
        while (e > 1 && out[e - 1] == '/') /* "d/" names d */
            e--;
        size_t s = e;
        while (s > 0 && out[s - 1] != '/')
            s--;
        const char *last = out + s;
        size_t llen = e - s;
        int whole = (llen == 2 && last[0] == '.' && last[1] == '.') || (llen == 1 && last[0] == '.');
        memcpy(dir, out, whole ? e : s);
        dir[whole ? e : s] = '\0';
        char resolved[PATH_MAX];
        if (!realpath(dir[0] ? dir : "/", resolved)) {
            /* a store's root has no directories on disk to resolve: paths under it are lexical */
            size_t n = monarch_store_roots ? monarch_normalize(out) : 0;
            for (unsigned i = 0; i < n && i < monarch_nroots; i++) {
                const struct monarch_root *r = &monarch_roots[i];
                if (r->index < 64 && ((monarch_store_roots >> r->index) & 1) && n >= r->len
                    && memcmp(out, r->path, r->len) == 0 && (out[r->len] == '/' || out[r->len] == '\0')) {
                    *lenp = n;
                    return 0;
                }
            }
            return -1;
        }
        size_t rl = strlen(resolved);
        if (!whole) {
            if (rl + 1 + llen >= PATH_MAX)
                return -1;
            resolved[rl++] = '/';
            memcpy(resolved + rl, last, llen);
            rl += llen;
            resolved[rl] = '\0';
        }
        memcpy(out, resolved, rl + 1);
    }
    *lenp = monarch_normalize(out);
    return 0;
}

/* A trailing "/", "/." or "/.." asks for a directory: leave such paths to the kernel. */
static int monarch_wants_dir(const char *path)
{
    size_t n = strlen(path);
    if (path[n - 1] == '/')
        return 1;
    if (path[n - 1] != '.')
        return 0;
    if (n == 1 || path[n - 2] == '/')
        return 1;
    return path[n - 2] == '.' && (n == 2 || path[n - 3] == '/');
}

/* The key "<k>/<rel>" of (dirfd, path) into key[MONARCH_KEY_MAX] when it lies under a
 * root (with allow_root, root k itself too: the key "<k>/"); 0, its length in *klp and k
 * in *kp, or -1 when not managed. The absolute path is left in abs[PATH_MAX]. */
static int monarch_key_abs(int dirfd, const char *path, int allow_root, char *key, size_t *klp, unsigned *kp,
                           char *abs)
{
    size_t len;
    if (monarch_abspath(dirfd, path, abs, &len) != 0)
        return -1;
    for (unsigned i = 0; i < monarch_nroots; i++) {
        struct monarch_root *r = &monarch_roots[i];
        size_t rl; /* the length of rel, at abs + r->len + 1 */
        if (len < r->len || memcmp(abs, r->path, r->len) != 0)
            continue;
        if (len > r->len + 1 && abs[r->len] == '/')
            rl = len - r->len - 1;
        else if (allow_root && (len == r->len || (r->len == 0 && len == 1)))
            rl = 0;
        else
            continue;
        if (MONARCH_UNLIKELY(!monarch_at_roots))
            monarch_count_at_roots(); /* a reader: it calls under a root */
        if (MONARCH_UNLIKELY(__atomic_load_n(&r->view, __ATOMIC_RELAXED) != MONARCH_VIEW_SAME) && monarch_root_elsewhere(r))
            continue; /* not the daemon's root here: the kernel's files (shim_view.c) */
        /* "<k>/<rel>": the root's prefix made at start-up (an snprintf here cost ~0.1 us an open) */
        size_t kl = r->kprefix_len + rl;
        if (kl >= MONARCH_KEY_MAX || kl > MONARCH_MAX_REQUEST)
            return -1;
        memcpy(key, r->kprefix, r->kprefix_len);
        memcpy(key + r->kprefix_len, abs + r->len + 1, rl);
        key[kl] = '\0';
        *klp = kl;
        *kp = r->index;
        return 0;
    }
    return -1;
}

/* The key of a path strictly under a root (what opens and INVALIDATE name). */
static int monarch_key(int dirfd, const char *path, char *key, size_t *klp)
{
    char abs[PATH_MAX];
    unsigned k;
    return monarch_key_abs(dirfd, path, 0, key, klp, &k, abs);
}

/* <probe dir>/<key> into out[PATH_MAX]; -1 if too long. */
static int monarch_probe_path(const struct monarch_probe *pr, const char *key, size_t kl, char *out)
{
    if (pr->len + 1 + kl >= PATH_MAX || __atomic_load_n(&pr->fd, __ATOMIC_RELAXED) == MONARCH_PROBE_UNSEEN)
        return -1;
    memcpy(out, pr->dir, pr->len);
    out[pr->len] = '/';
    memcpy(out + pr->len + 1, key, kl + 1);
    return 0;
}

/* ---- probe directories, each opened once per process ----
 * A hit opened <probe dir>/<key> by its full path: the kernel looked up every component of
 * the probe dir again (3 on the shipped layout: /dev/shm/monarch-<uid>/<run dir>). Each probe dir
 * is opened once (O_PATH, close-on-exec) at its first probe and copies are opened relative to
 * it. The number is in the application's table too:
 *   - the application's close of it (close, close_range, dup2/dup3 onto it) forgets it first
 *     (monarch_probe_dir_closing; not in a vfork child, whose table is its own), and the next
 *     probe opens the dir again;
 *   - a number closed behind the shim's back (a raw syscall, glibc's closefrom) and reused is
 *     caught before its copy is used: a copy through it must be on the dir's device and of the
 *     snapshot's size and mtime (the daemon's copies carry the source's); if not, or when the
 *     open fails with EBADF or ENOTDIR, the descriptor is checked against the dir's identity
 *     (one fstat, off the hit's path) and, if it is no longer the dir, forgotten (not closed:
 *     not ours any more) and the copy opened by path as before; a probe that missed what the
 *     daemon then names checks it too (monarch_probe_dirs_check), so misses do not persist.
 * A fork child shares the descriptor; exec closes it. A dir that does not open: by path. */

/* The probe dir's descriptor, opened at the first call; < 0: open by path. */
static int monarch_probe_fd(struct monarch_probe *pr)
{
    int fd = __atomic_load_n(&pr->fd, __ATOMIC_ACQUIRE), want = MONARCH_PROBE_UNOPENED;
    if (MONARCH_LIKELY(fd >= 0) || fd != MONARCH_PROBE_UNOPENED
        || !__atomic_compare_exchange_n(&pr->fd, &want, MONARCH_PROBE_OPENING, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
        return fd;
    struct stat st;
    fd = MONARCH_RESOLVE(openat)(AT_FDCWD, pr->len ? pr->dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && monarch_sys_fstat(fd, &st) != 0) {
        real_close(fd);
        fd = -1;
    }
    if (monarch_probe_unseen(pr, fd, &st)) { /* not the daemon's folder here: never probed */
        if (fd >= 0)
            real_close(fd);
        __atomic_store_n(&pr->fd, MONARCH_PROBE_UNSEEN, __ATOMIC_RELEASE);
        return MONARCH_PROBE_UNSEEN;
    }
    if (fd >= 0) {
        pr->dev = st.st_dev;
        pr->ino = st.st_ino;
    }
    MONARCH_DEBUG(2, "probe slot %u: %s opened as fd %d", pr->slot, pr->dir, fd);
    __atomic_store_n(&pr->fd, fd >= 0 ? fd : MONARCH_PROBE_BY_PATH, __ATOMIC_RELEASE);
    return fd;
}

/* Is fd (pr's descriptor when it was read) still the probe dir? If not, forget it (only
 * if no other thread has yet): 0. */
static int monarch_probe_fd_valid(struct monarch_probe *pr, int fd)
{
    struct stat st;
    if (monarch_sys_fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_dev == pr->dev && st.st_ino == pr->ino)
        return 1;
    MONARCH_DEBUG(1, "probe slot %u: fd %d is no longer %s; forgotten", pr->slot, fd, pr->dir);
    __atomic_compare_exchange_n(&pr->fd, &fd, MONARCH_PROBE_UNOPENED, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    return 0;
}

/* After a probe missed what the daemon then named: every opened probe dir checked. */
static void monarch_probe_dirs_check(void)
{
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        int fd = __atomic_load_n(&monarch_probes[i].fd, __ATOMIC_ACQUIRE);
        if (fd >= 0)
            monarch_probe_fd_valid(&monarch_probes[i], fd);
    }
}

/* The application closes the descriptors [first, last] (or makes them others): a probe dir's
 * among them is forgotten first, so that the shim never opens relative to a reused number. */
static void monarch_probe_dir_closing(unsigned first, unsigned last)
{
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        int fd = __atomic_load_n(&monarch_probes[i].fd, __ATOMIC_ACQUIRE);
        if (MONARCH_UNLIKELY(fd >= 0 && (unsigned)fd >= first && (unsigned)fd <= last) && getpid() == monarch_pid)
            __atomic_compare_exchange_n(&monarch_probes[i].fd, &fd, MONARCH_PROBE_UNOPENED, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED);
    }
}

/* MONARCH_SHARED_SLOTS ("s,s,..."): the probe dirs whose copies the user's other jobs may have
 * staged, each checked against this job's index before it is served. */
static void monarch_parse_shared(const char *list)
{
    for (const char *c = list; c && *c;) {
        char *end;
        unsigned long s = strtoul(c, &end, 10);
        if (end == c)
            break;
        for (unsigned i = 0; i < monarch_nprobes; i++)
            if (monarch_probes[i].slot == s)
                monarch_probes[i].shared = 1;
        c = *end == ',' ? end + 1 : end;
    }
}

/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_pages.h).
 * Here: a guarded fault of a random reader on another owner's block, in a window (a cluster's
 * file larger than this node's room), served with the pages it touches from that owner's copy.
 *
 * Such a reader touches a few bytes of a block (a token window, a record): another owner's whole
 * block for them would move 256 times the bytes and push out of the window the blocks a reader in
 * order needs, and the PFS would read their page once more for the cluster. So the faulting thread
 * asks the daemon's front door (VERB_PAGES, on a connection the thread keeps) for the fault's page
 * and the ones after it in its block; the door fetches them from the block's owner (its name is in
 * the map: the owners after the states) through the C data path, which answers from the owner's
 * copy only where those blocks are STAGED there; the bytes are put over the guarded pages in one
 * step (mremap of pages of this process's own), as a LENT block's copy is (shim_guard.c).
 * Anything else (no door, the owner lost or without the block, no answer in MONARCH_PAGES_WAIT_MS)
 * is answered by the caller as before: the page from the PFS. A process keeps MONARCH_PAGES_RING
 * such runs and PFS pages (its memory, and two mappings each at most: the kernel's limit on them
 * is the application's too); the oldest is guarded again past that (the application's file mapped
 * over it, PROT_NONE). MONARCH_PAGES_FAILS_MAX failures in a row
 * send the process's faults to the PFS, a page each, for MONARCH_PAGES_PAUSE_MS before it asks
 * again. (Slow answers are not failures: at the job's start, when every owner reads its own
 * ranges and sends the others' blocks, a fault's round trip takes 3-20 ms; pausing on them, or on
 * their moving mean, read the PFS 1.15-1.35x the file and made the job slower, not faster.) */
#include "shim_pages.h"

#define MONARCH_PAGES_RUN (16 << 10) /* bytes a fault asks for: its page and those after it, in its block */
#define MONARCH_PAGES_RING 1024      /* runs kept in a process's pages at once (16 MiB of its memory) */
#define MONARCH_PAGES_WAIT_MS 20     /* a fault's answer, at most (the door gives up on the owner sooner): then the PFS */
#define MONARCH_PAGES_FAILS_MAX 8    /* fetches failed in a row (the owners lost, busy, without the blocks yet) ... */
#define MONARCH_PAGES_PAUSE_MS 500   /* ... send this process's faults to the PFS, a page each, for this long */
_Static_assert(MONARCH_PAGES_RUN <= MONARCH_PAGES_MAX, "a run is one PAGES request");

/* the runs put over guarded pages and the PFS pages made readable in their place, oldest first (a
 * ring): the mapping, the run's address and length, its block */
static struct {
    uintptr_t addr, at;
    size_t len;
    uint64_t block;
} monarch_page_runs[MONARCH_PAGES_RING];
static unsigned monarch_page_runs_at;
static unsigned monarch_pages_fails;     /* fetches failed in a row (relaxed: a hint) */
static long monarch_pages_paused_until;  /* monotonic ms: no fetch before then */

/* this thread's connection to the front door for PAGES (kept: a round trip is a fault's cost) */
static __thread int monarch_pages_fd __attribute__((tls_model("initial-exec"))) = -1;
static __thread pid_t monarch_pages_pid __attribute__((tls_model("initial-exec")));
static __thread ino_t monarch_pages_ino __attribute__((tls_model("initial-exec")));

static int monarch_pages_may_locked(const struct monarch_mapping *m, const struct monarch_part *pt, uint64_t b)
{
    return pt->owners && m->pfs_fd >= 0 && b < pt->blocks && pt->owners[b] >= 0 && monarch_have_socket
           && __atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE);
}

static int monarch_pages_paused(void)
{
    return __atomic_load_n(&monarch_pages_paused_until, __ATOMIC_RELAXED) > monarch_now_ms();
}

/* This thread's connection closed, if the descriptor is still that socket (``child``: in a fork
 * child, its copy of the parent's; the parent's stays open and kept). */
static void monarch_pages_close(int child)
{
    struct stat st;
    if (monarch_pages_fd >= 0 && (child || monarch_pages_pid == getpid())
        && syscall(SYS_newfstatat, monarch_pages_fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_ino == monarch_pages_ino)
        real_close(monarch_pages_fd);
    monarch_pages_fd = -1;
}

static void monarch_pages_thread_exit(void)
{
    monarch_pages_close(0);
}

static void monarch_pages_atfork_child(void)
{
    if (monarch_pages_fd >= 0)
        monarch_pages_close(1);
}

/* This thread's kept connection, if it is still the socket it kept in this process, else a new
 * one (kept from then on); -1 if the daemon cannot be reached. */
static int monarch_pages_conn(void)
{
    struct stat st;
    if (monarch_pages_fd >= 0 && monarch_pages_pid == getpid()
        && syscall(SYS_newfstatat, monarch_pages_fd, "", &st, AT_EMPTY_PATH) == 0 && S_ISSOCK(st.st_mode)
        && st.st_ino == monarch_pages_ino)
        return monarch_pages_fd;
    monarch_pages_fd = -1;
    int s = monarch_connect(MONARCH_PAGES_WAIT_MS);
    if (s < 0 || syscall(SYS_newfstatat, s, "", &st, AT_EMPTY_PATH) != 0) {
        if (s >= 0)
            real_close(s);
        return -1;
    }
    monarch_conn_close_at_exit();
    monarch_pages_fd = s;
    monarch_pages_pid = getpid();
    monarch_pages_ino = st.st_ino;
    return s;
}

static void monarch_pages_conn_drop(void)
{
    if (monarch_pages_fd >= 0)
        real_close(monarch_pages_fd);
    monarch_pages_fd = -1;
}

/* One PAGES exchange: the request ``req`` (``n`` bytes, a whole frame), its answer's ``len`` bytes
 * into ``dst``. 0, or -1 (not served). Async-signal-safe (system calls only). */
static int monarch_pages_ask(const unsigned char *req, size_t n, char *dst, size_t len)
{
    int s = monarch_pages_conn();
    if (s < 0)
        return -1;
    for (size_t off = 0; off < n;) {
        ssize_t w = send(s, req + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            monarch_pages_conn_drop();
            return -1;
        }
        off += (size_t)w;
    }
    long deadline = monarch_now_ms() + MONARCH_PAGES_WAIT_MS;
    unsigned char hdr[MONARCH_ANSWER_HEADER_SIZE];
    if (monarch_recv_exact(s, hdr, sizeof hdr, deadline, NULL) != 0) {
        monarch_pages_conn_drop(); /* (an answer may still come on it) */
        return -1;
    }
    int32_t st = (int32_t)monarch_le32(hdr);
    uint32_t blen = monarch_le32(hdr + 4);
    if ((st != 0 && st != MONARCH_ANSWER_KEPT) || blen != len || monarch_recv_exact(s, dst, len, deadline, NULL) != 0) {
        monarch_pages_conn_drop(); /* refused (its body unread), or cut short */
        return -1;
    }
    if (st != MONARCH_ANSWER_KEPT)
        monarch_pages_conn_drop();
    return 0;
}

/* Pages [at, at + len) of block b of m kept in the ring, in place of its oldest run, which is
 * guarded again if its block still is (else its pages are the block's own now, or the PFS's: left
 * as they are). Under the registry's lock. */
static void monarch_pages_keep_locked(const struct monarch_mapping *m, uintptr_t at, size_t len, uint64_t b)
{
    unsigned r = monarch_page_runs_at;
    monarch_page_runs_at = (r + 1) % MONARCH_PAGES_RING;
    uintptr_t addr = monarch_page_runs[r].addr;
    for (unsigned k = 0; addr && k < MONARCH_MAX_MAPPINGS; k++) {
        struct monarch_mapping *o = &monarch_mappings[k];
        if (o->addr != addr)
            continue;
        uint64_t ob = monarch_page_runs[r].block, i = ob - o->first;
        if (ob >= o->first && ob <= o->last && monarch_guarded(o, ob) && o->pfs_fd >= 0
            && monarch_page_runs[r].at + monarch_page_runs[r].len <= o->addr + o->len
            && !((o->moved[i / 8] >> (i % 8)) & 1) && !(o->copied && ((o->copied[i / 8] >> (i % 8)) & 1)))
            MONARCH_RESOLVE(mmap)((void *)monarch_page_runs[r].at, monarch_page_runs[r].len, PROT_NONE,
                                  o->share | MAP_FIXED, o->pfs_fd,
                                  (off_t)(o->off + (monarch_page_runs[r].at - o->addr)));
        break;
    }
    monarch_page_runs[r].addr = m->addr;
    monarch_page_runs[r].at = at;
    monarch_page_runs[r].len = len;
    monarch_page_runs[r].block = b;
}

static int monarch_pages_serve(uintptr_t a)
{
    size_t page = monarch_guard_page;
    uintptr_t at = a & ~(uintptr_t)(page - 1), addr;
    size_t len, want, reqlen;
    uint64_t b;
    unsigned char small[512], *req = small; /* (a longer key's request: pages of its own, not malloc) */
    /* under the lock: the mapping, the run, and the request (its key copied: the part may go meanwhile) */
    {
        sigset_t maps_held_;
        MONARCH_MAPS_LOCK(maps_held_);
        struct monarch_mapping *m = monarch_mapping_at_locked(a);
        struct monarch_part *pt = m ? &monarch_parts[m->part - 1] : NULL;
        b = m ? (m->off + (a - m->addr)) >> pt->shift : 0;
        if (!m || !monarch_guarded(m, b) || !monarch_pages_may_locked(m, pt, b) || !pt->key) {
            MONARCH_MAPS_UNLOCK(maps_held_);
            return 0;
        }
        void *blk;
        size_t blen;
        monarch_guard_span(m, pt, b, b, &blk, &blen); /* the run stays in the fault's block and mapping */
        uint64_t from = m->off + (at - m->addr);
        len = MONARCH_PAGES_RUN;
        if (at + len > (uintptr_t)blk + blen)
            len = (uintptr_t)blk + blen - at;
        uint64_t in_file = (pt->size + page - 1) / page * page; /* (past the file's last page: SIGBUS, left so) */
        if (from >= in_file) {
            MONARCH_MAPS_UNLOCK(maps_held_);
            return 0;
        }
        len = from + len > in_file ? (size_t)(in_file - from) : len;
        want = from + len > pt->size ? (size_t)(pt->size - from) : len; /* the rest of the last page: zeros */
        reqlen = MONARCH_REQUEST_HEADER_SIZE + sizeof(struct monarch_pages_request) + pt->key_len;
        if (reqlen > sizeof small)
            req = MONARCH_RESOLVE(mmap)(NULL, reqlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (req == MAP_FAILED) {
            MONARCH_MAPS_UNLOCK(maps_held_);
            return 0;
        }
        uint32_t body = (uint32_t)(reqlen - MONARCH_REQUEST_HEADER_SIZE);
        req[0] = MONARCH_VERB_PAGES;
        req[1] = MONARCH_REQUEST_KEEP;
        req[2] = req[3] = 0;
        memcpy(req + 4, &body, 4);
        struct monarch_pages_request pr = {.size = pt->size, .mtime_ns = pt->hdr->mtime_ns, .offset = from,
                                           .length = (uint32_t)want, .owner = pt->owners[b]};
        memcpy(req + MONARCH_REQUEST_HEADER_SIZE, &pr, sizeof pr);
        memcpy(req + MONARCH_REQUEST_HEADER_SIZE + sizeof pr, pt->key, pt->key_len);
        addr = m->addr;
        MONARCH_MAPS_UNLOCK(maps_held_);
    }
    /* the fetch, no lock held: into pages of this process's own */
    char *tmp = MONARCH_RESOLVE(mmap)(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                                      -1, 0); /* (populated: one call, not a fault per page as the answer lands) */
    int got = tmp != MAP_FAILED && monarch_pages_ask(req, reqlen, tmp, want) == 0;
    if (req != small)
        MONARCH_RESOLVE(munmap)(req, reqlen);
    if (got)
        __atomic_store_n(&monarch_pages_fails, 0, __ATOMIC_RELAXED);
    else if (__atomic_add_fetch(&monarch_pages_fails, 1, __ATOMIC_RELAXED) >= MONARCH_PAGES_FAILS_MAX) {
        __atomic_store_n(&monarch_pages_fails, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&monarch_pages_paused_until, monarch_now_ms() + MONARCH_PAGES_PAUSE_MS, __ATOMIC_RELAXED);
    }
    if (!got) {
        if (tmp != MAP_FAILED)
            MONARCH_RESOLVE(munmap)(tmp, len);
        return 0;
    }
    /* under the lock again: put over the guarded pages if the mapping and its guard are still there */
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    struct monarch_mapping *m = NULL;
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS && !m; i++)
        if (monarch_mappings[i].addr == addr && a < addr + monarch_mappings[i].len)
            m = &monarch_mappings[i];
    int put = m && b >= m->first && b <= m->last && monarch_guarded(m, b)
              && MONARCH_RESOLVE(mprotect)(tmp, len, m->prot) == 0
              && syscall(SYS_mremap, tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)at) != -1;
    if (put) {
        /* the run's last page stands for the fault's: a reader going in order faults next on the
         * page after the run, in order still (and its blocks are wanted ahead once it is: shim_guard.c) */
        if (m->fault_page == at)
            m->fault_page = at + len - page;
        monarch_pages_keep_locked(m, at, len, b);
        monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_PAGES, 1);
    }
    int lifted = !m || !(b >= m->first && b <= m->last && monarch_guarded(m, b)); /* the access runs again */
    MONARCH_MAPS_UNLOCK(maps_held_);
    if (!put)
        MONARCH_RESOLVE(munmap)(tmp, len);
    return put || lifted;
}

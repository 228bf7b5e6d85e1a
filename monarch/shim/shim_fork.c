/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_fork.h). Here:
 * fork. A job is bash scripts, forks of forks, threads that fork, daemons: every fork runs these
 * handlers, in every process of the job, so - the prepare handler takes a lock only where a thread
 * may be inside it (shim_blocks.c: the registry's and the parts' locks, in a process that made a
 * part), and the parent's and the child's handlers both release what it took: a child, and its
 * children, find them free; - the child's handler is async-signal-safe (stores, close, getpid:
 * POSIX allows no more after a multithreaded process forks), starts no thread (a child with
 * mappings to move starts its remapper at its first read, open or mapping) and stores only what
 * changes (each page it writes is a page the kernel copies). A vfork child runs no handler: it
 * shares the parent's memory and is told apart by its pid.
 */
#include "shim_fork.h"

/* fork raced with start-up in another thread, which does not exist in the child: start-up
 * runs again there at its first call */
static void monarch_child_restart_init(void)
{
    if (!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)) {
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        monarch_once = fresh;
    }
}

static void monarch_atfork_child(void)
{
    monarch_raw_atfork_child(); /* dispatch is not inherited: the child's one thread watched again */
    /* Per-process state: the pid (vfork detection, debug prefix) and the guard of the forking
     * thread. The counters and index mappings are inherited, the fd tables with the
     * descriptors they describe, a stop of probing holds for the child too, and the daemon is
     * asked over a fresh connection (the kept one is the parent's: closed here). */
    if (!__atomic_load_n(&monarch_enabled, __ATOMIC_RELAXED)) {
        monarch_child_restart_init();
        return; /* passing everything through: no state of its own to reset */
    }
    monarch_pid = getpid();
    if (monarch_guard)
        monarch_guard = 0;
    monarch_daemon_atfork_child(); /* the forking thread's kept connection is the parent's: this copy closed */
    monarch_wb_atfork_child();     /* and so is its write-back connection */
    monarch_zpool_atfork_child();
    monarch_count_process(1); /* a DataLoader worker is a process with the shim too */
    monarch_view_atfork_child(); /* and a reader of its own once it calls under a root */
    /* a thread of the parent was installing the index, or looking for it: it is not here to finish */
    if (__atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE) == MONARCH_IX_INSTALLING)
        __atomic_store_n(&monarch_index_state, monarch_idx() ? MONARCH_IX_MAPPED : MONARCH_IX_UNKNOWN,
                         __ATOMIC_RELEASE);
    if (monarch_pfs_why != -1)
        monarch_pfs_why = -1;
    for (unsigned i = 0; i < monarch_nprobes; i++) /* a parent's thread was opening a probe dir: again here */
        if (monarch_probes[i].fd == MONARCH_PROBE_OPENING)
            monarch_probes[i].fd = MONARCH_PROBE_UNOPENED;
    monarch_zstd_atfork_child();
    monarch_child_restart_init();
}

/* The constructor's: the blocks' lock handlers around fork, then the child's per-process state. */
static void monarch_fork_handlers(void)
{
    pthread_atfork(NULL, NULL, monarch_atfork_child);
    pthread_atfork(monarch_blocks_prefork, monarch_blocks_postfork_parent, monarch_blocks_postfork_child);
}

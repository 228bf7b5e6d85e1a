/* A run's tier removed at its end, by a few threads outside the interpreter: a tier of a
 * million small copies is a million unlinks, which Python's rmtree made one at a time with
 * an interpreter step each (design principle 12: a tear-down no slower than rm -rf).
 *
 * Directories are the unit of work: a thread takes one from a shared queue, unlinks its
 * files and queues its subdirectories (or, once the queue holds enough for every thread,
 * empties them itself, depth first). Threads in different directories do not wait for each
 * other's directory lock; within one directory they would. Every directory is opened with
 * O_NOFOLLOW, one component at a time from the top: a symlink planted in the tier is
 * unlinked, never followed. The emptied directories are removed last, bottom up, on one
 * thread (there are few beside the files), then the top itself.
 *
 * Use (monarch/node/tiers/remover.py): remove_tree(path, threads, out) -> 0 when the whole tree is
 * gone, -1 if anything stayed (out[0] entries removed, out[1] left). */

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../native/monarch_native.h" /* EXPORT */
#define MAX_THREADS 64
#define QUEUE_ENOUGH 4      /* queued directories per thread beyond which a thread empties its own */

struct job {
    int top;                 /* the tree's top directory */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char **queue;            /* directories to empty: paths below the top, "a/b" */
    size_t n, cap;
    int busy;                /* threads emptying a directory (they may queue more) */
    int threads;
    uint64_t removed, left;  /* under mu */
};

/* ``rel`` ("a/b") opened below ``top``, one component at a time, no symlink followed; or -1. */
static int open_below(int top, const char *rel)
{
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = openat(top, ".", flags);
    char part[NAME_MAX + 1];
    for (const char *p = rel; fd >= 0 && *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        int next = -1;
        if (n > 0 && n <= NAME_MAX) {
            memcpy(part, p, n);
            part[n] = 0;
            next = openat(fd, part, flags);
        }
        close(fd);
        fd = next;
        p += n + (slash != NULL);
    }
    return fd;
}

/* "rel/name" ("name" below the top, where rel is ""), malloc'ed; NULL if out of memory. */
static char *join(const char *rel, const char *name)
{
    size_t rl = strlen(rel), nl = strlen(name);
    char *path = malloc(rl + nl + 2);
    if (!path)
        return NULL;
    if (rl) {
        memcpy(path, rel, rl);
        path[rl++] = '/';
    }
    memcpy(path + rl, name, nl + 1);
    return path;
}

static int push(struct job *j, const char *rel, const char *name)
{
    char *path = join(rel, name);
    if (!path)
        return -1;
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 256;
        char **more = realloc(j->queue, cap * sizeof *more);
        if (!more) {
            free(path);
            return -1;
        }
        j->queue = more;
        j->cap = cap;
    }
    j->queue[j->n++] = path;
    pthread_cond_signal(&j->cv);
    return 0;
}

static int is_dir(int dfd, const struct dirent *e)
{
    if (e->d_type != DT_UNKNOWN)
        return e->d_type == DT_DIR;
    struct stat st;
    return fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* Unlink every file below ``dfd`` (``rel``: its path below the top); its subdirectories are
 * queued for other threads while the queue is short, else emptied here. The directories
 * themselves stay (remove_dirs). */
static void empty(struct job *j, int dfd, const char *rel)
{
    int lister = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  /* its own offset: a dup's is shared */
    DIR *dir = lister < 0 ? NULL : fdopendir(lister);
    uint64_t removed = 0, left = 0;
    if (!dir) {
        if (lister >= 0)
            close(lister);
        left++;
    }
    for (struct dirent *e; dir && (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!is_dir(dfd, e)) {
            if (unlinkat(dfd, e->d_name, 0) == 0)
                removed++;
            else if (errno != ENOENT)
                left++;
            continue;
        }
        pthread_mutex_lock(&j->mu);
        int queued = j->n < (size_t)(QUEUE_ENOUGH * j->threads) && push(j, rel, e->d_name) == 0;
        pthread_mutex_unlock(&j->mu);
        if (queued)
            continue;
        int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            left++;
            continue;
        }
        char *path = join(rel, e->d_name);
        if (path) {
            empty(j, sub, path);
            free(path);
        } else {
            left++;
        }
        close(sub);
    }
    if (dir)
        closedir(dir);
    pthread_mutex_lock(&j->mu);
    j->removed += removed;
    j->left += left;
    pthread_mutex_unlock(&j->mu);
}

static void *worker(void *arg)
{
    struct job *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->n && j->busy)
            pthread_cond_wait(&j->cv, &j->mu);
        if (!j->n)
            break;                     /* nothing queued and nobody left to queue more */
        char *rel = j->queue[--j->n];
        j->busy++;
        pthread_mutex_unlock(&j->mu);
        int fd = open_below(j->top, rel);
        if (fd >= 0) {
            empty(j, fd, rel);
            close(fd);
        } else {
            pthread_mutex_lock(&j->mu);
            j->left++;
            pthread_mutex_unlock(&j->mu);
        }
        free(rel);
        pthread_mutex_lock(&j->mu);
        if (--j->busy == 0 && !j->n)
            pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* The directories below ``dfd``, emptied of files by now, removed bottom up; anything still
 * there (a copy written meanwhile) is unlinked too. */
static void remove_dirs(struct job *j, int dfd)
{
    int lister = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  /* its own offset: a dup's is shared */
    DIR *dir = lister < 0 ? NULL : fdopendir(lister);
    if (!dir) {
        if (lister >= 0)
            close(lister);
        return;
    }
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (is_dir(dfd, e)) {
            int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                remove_dirs(j, sub);
                close(sub);
            }
            if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) == 0)
                j->removed++;
        } else if (unlinkat(dfd, e->d_name, 0) == 0) {
            j->removed++;
        }
    }
    closedir(dir);
}

EXPORT int remove_tree(const char *path, int threads, uint64_t *out)
{
    struct job j = {.threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads};
    out[0] = out[1] = 0;
    j.top = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (j.top < 0)
        return errno == ENOENT ? 0 : -1;
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    pthread_t tid[MAX_THREADS];
    int started = 0;
    pthread_mutex_lock(&j.mu);
    int queued = push(&j, "", "") == 0;    /* the top itself, as "" */
    pthread_mutex_unlock(&j.mu);
    for (int i = 0; queued && i < j.threads; i++)
        started += pthread_create(&tid[started], NULL, worker, &j) == 0;
    if (!started && queued)
        worker(&j);                    /* no thread could start: this one does it all */
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    for (size_t i = 0; i < j.n; i++)
        free(j.queue[i]);
    free(j.queue);
    remove_dirs(&j, j.top);
    close(j.top);
    int gone = rmdir(path) == 0 || errno == ENOENT;
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
    out[0] = j.removed + (gone ? 1 : 0);
    out[1] = gone ? 0 : j.left + 1;
    return gone ? 0 : -1;
}

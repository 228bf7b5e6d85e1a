/* meta.c -- the metadata calls of a C program, printed: for each path, stat, lstat, statx,
 * access, and for a directory its listing through opendir/readdir and through
 * open(O_DIRECTORY)+fdopendir+readdir64 with fstatat of each name, sorted by name. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void show_stat(const char *what, int r, const struct stat *st)
{
    if (r != 0) {
        printf("  %s: errno %d\n", what, errno);
        return;
    }
    printf("  %s: mode %o size %lld nlink %lu uid %u gid %u ino %llu dev %llu blocks %lld mtime %lld.%09ld\n", what,
           st->st_mode, (long long)st->st_size, (unsigned long)st->st_nlink, st->st_uid, st->st_gid,
           (unsigned long long)st->st_ino, (unsigned long long)st->st_dev, (long long)st->st_blocks,
           (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void listing(const char *path, int via_fd)
{
    DIR *d;
    if (via_fd) {
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        d = fd < 0 ? NULL : fdopendir(fd);
    } else {
        d = opendir(path);
    }
    if (!d) {
        printf("  %s: errno %d\n", via_fd ? "fdopendir" : "opendir", errno);
        return;
    }
    char *lines[4096];
    int n = 0;
    struct dirent64 *e;
    while (n < 4096 && (e = via_fd ? readdir64(d) : (struct dirent64 *)readdir(d)) != NULL) {
        char line[600];
        int len = snprintf(line, sizeof line, "    %s type %d ino %llu", e->d_name, e->d_type,
                           (unsigned long long)e->d_ino);
        if (via_fd && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            struct stat st;
            int r = fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW);
            snprintf(line + len, sizeof line - len, " fstatat %d mode %o size %lld", r, r ? 0 : st.st_mode,
                     r ? 0LL : (long long)st.st_size);
        }
        lines[n++] = strdup(line);
    }
    long end = telldir(d);
    rewinddir(d);
    int again = 0;
    while (readdir(d))
        again++;
    closedir(d);
    qsort(lines, n, sizeof *lines, by_name);
    printf("  %s: %d names, %d after rewinddir, telldir at end %s\n", via_fd ? "fdopendir" : "opendir", n, again,
           end >= 0 ? "ok" : "failed");
    for (int i = 0; i < n; i++) {
        printf("%s\n", lines[i]);
        free(lines[i]);
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *p = argv[i];
        struct stat st;
        struct statx sx;
        printf("%s\n", p);
        int r = stat(p, &st);
        show_stat("stat", r, &st);
        int dir = r == 0 && S_ISDIR(st.st_mode);
        r = lstat(p, &st);
        show_stat("lstat", r, &st);
        r = statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx);
        if (r == 0)
            printf("  statx: mask %x mode %o size %llu ino %llu nlink %u blocks %llu mtime %lld.%09u dev %u:%u\n",
                   sx.stx_mask & STATX_BASIC_STATS, sx.stx_mode, (unsigned long long)sx.stx_size,
                   (unsigned long long)sx.stx_ino, sx.stx_nlink, (unsigned long long)sx.stx_blocks,
                   (long long)sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec, sx.stx_dev_major, sx.stx_dev_minor);
        else
            printf("  statx: errno %d\n", errno);
        errno = 0;
        r = access(p, F_OK);
        printf("  access F_OK %d errno %d\n", r, r ? errno : 0);
        errno = 0;
        r = access(p, R_OK | X_OK);
        printf("  access R_OK|X_OK %d errno %d\n", r, r ? errno : 0);
        errno = 0;
        r = faccessat(AT_FDCWD, p, R_OK, AT_EACCESS);
        printf("  faccessat R_OK %d errno %d\n", r, r ? errno : 0);
        if (dir) {
            listing(p, 0);
            listing(p, 1);
        }
    }
    return 0;
}

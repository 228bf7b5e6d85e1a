/*
 * statfd stat PATH      open PATH read-only and print what each descriptor stat call
 *                       says, one line per call: "<call> size mode mtime_ns ino dev uid gid nlink"
 *                       (fstat, fstatat(fd, "", AT_EMPTY_PATH), statx(fd, "", AT_EMPTY_PATH));
 *                       then the bytes of PATH on stdout after a line "--".
 * statfd creat PATH TEXT  creat(PATH), write TEXT, close.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void line(const char *call, long long size, unsigned mode, long long mtime_ns, unsigned long long ino,
                 unsigned long long dev, unsigned uid, unsigned gid, unsigned long long nlink)
{
    printf("%s %lld %o %lld %llu %llu %u %u %llu\n", call, size, mode, mtime_ns, ino, dev, uid, gid, nlink);
}

static void show(const char *call, const struct stat *st)
{
    line(call, (long long)st->st_size, st->st_mode, st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec,
         (unsigned long long)st->st_ino, (unsigned long long)st->st_dev, st->st_uid, st->st_gid,
         (unsigned long long)st->st_nlink);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "creat")) {
        int fd = creat(argv[2], 0644);
        if (fd < 0 || write(fd, argv[3], strlen(argv[3])) != (ssize_t)strlen(argv[3]) || close(fd) != 0)
            return perror("creat"), 1;
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "freopen")) { /* glibc opens the path internally */
        FILE *fp = freopen(argv[2], "w", stdout);
        if (!fp || fputs(argv[3], fp) < 0 || fclose(fp) != 0)
            return perror("freopen"), 1;
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "stat"))
        return fprintf(stderr, "usage: statfd stat PATH | statfd creat|freopen PATH TEXT\n"), 2;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return perror("open"), 1;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return perror("fstat"), 1;
    show("fstat", &st);
    if (fstatat(fd, "", &st, AT_EMPTY_PATH) != 0)
        return perror("fstatat"), 1;
    show("fstatat", &st);
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx) != 0)
        return perror("statx"), 1;
    line("statx", (long long)sx.stx_size, sx.stx_mode, sx.stx_mtime.tv_sec * 1000000000LL + sx.stx_mtime.tv_nsec,
         (unsigned long long)sx.stx_ino, (unsigned long long)makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_uid,
         sx.stx_gid, (unsigned long long)sx.stx_nlink);
    printf("--\n");
    fflush(stdout);
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        if (write(STDOUT_FILENO, buf, (size_t)n) != n)
            return 1;
    return close(fd) != 0;
}

/*
 * stdio_reader OPEN PATH SOURCE
 *
 * Reads PATH through stdio as C programs do, every byte checked against SOURCE (read apart
 * with pread): OPEN is "fopen" (fopen(PATH, "rb")) or "fdopen" (open, then fdopen of a dup
 * at an offset, as numpy's fromfile does, made unbuffered as some loaders make theirs). Then:
 *   - fileno and fstat of the FILE: the source's size; fseeko(SEEK_END) and ftello agree;
 *   - 20 records at random offsets (fseeko, then fread of 1 to 12,000 bytes), ftello after;
 *   - the whole file in fread calls of cycling odd sizes (7 B to 1 MiB + 3), then EOF;
 *   - getc, ungetc, fgets and fscanf at known offsets, rewind;
 *   - 20 records at random offsets again; with "fopen", freopen of PATH and its first bytes;
 *     fclose.
 * Prints one line: "ok" or the first check that failed; exits 0 either way (1: a usage or
 * source error).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int src = -1;
static off_t size;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            printf(__VA_ARGS__);                                                                \
            printf("\n");                                                                       \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

static int same(const char *got, off_t off, size_t n)
{
    static char want[(1 << 20) + 64];
    return pread(src, want, n, off) == (ssize_t)n && memcmp(got, want, n) == 0;
}

static int records(FILE *fp, unsigned *seed, const char *tag)
{
    static char buf[12000];
    for (int i = 0; i < 20; i++) {
        off_t off = (off_t)(rand_r(seed) % (unsigned)(size - (off_t)sizeof buf));
        size_t n = 1 + (size_t)rand_r(seed) % sizeof buf;
        CHECK(fseeko(fp, off, SEEK_SET) == 0, "%s: fseeko %lld", tag, (long long)off);
        CHECK(fread(buf, 1, n, fp) == n && same(buf, off, n), "%s: fread %zu at %lld", tag, n, (long long)off);
        CHECK(ftello(fp) == off + (off_t)n, "%s: ftello after %zu at %lld", tag, n, (long long)off);
    }
    return 0;
}

static int check(FILE *fp, off_t start)
{
    static char buf[(1 << 20) + 64];
    struct stat st;
    unsigned seed = 7;
    CHECK(ftello(fp) == start, "ftello at open: %lld", (long long)ftello(fp));
    CHECK(fileno(fp) >= 0 && fstat(fileno(fp), &st) == 0 && st.st_size == size, "fstat(fileno)");
    CHECK(fseeko(fp, 0, SEEK_END) == 0 && ftello(fp) == size, "fseeko SEEK_END");
    if (records(fp, &seed, "records"))
        return 1;
    static const size_t sizes[] = {7, 4096, 65537, 1000003, (1 << 20) + 3, 333};
    off_t off = 0;
    rewind(fp);
    for (unsigned i = 0;; i++) {
        size_t n = sizes[i % (sizeof sizes / sizeof sizes[0])];
        size_t r = fread(buf, 1, n, fp);
        CHECK(same(buf, off, r), "sequential fread %zu at %lld", n, (long long)off);
        off += (off_t)r;
        if (r < n)
            break;
    }
    CHECK(off == size && feof(fp) && !ferror(fp), "sequential: %lld of %lld", (long long)off, (long long)size);
    off_t at = size / 3;
    CHECK(fseeko(fp, at, SEEK_SET) == 0, "fseeko for getc");
    int c = getc(fp);
    CHECK(c != EOF && same((char[]){(char)c}, at, 1), "getc");
    CHECK(ungetc(c, fp) == c && getc(fp) == c && ftello(fp) == at + 1, "ungetc");
    CHECK(fgets(buf, 200, fp) != NULL && same(buf, at + 1, strlen(buf) ? strlen(buf) : 1), "fgets");
    CHECK(fseeko(fp, -100, SEEK_END) == 0 && fread(buf, 1, 200, fp) == 100 && same(buf, size - 100, 100),
          "the last 100 bytes");
    rewind(fp);
    char word[8];
    CHECK(fscanf(fp, "%7c", word) == 1 && same(word, 0, 7), "fscanf");
    return records(fp, &seed, "records again");
}

int main(int argc, char **argv)
{
    if (argc != 4 || (src = open(argv[3], O_RDONLY)) < 0 || (size = lseek(src, 0, SEEK_END)) < (1 << 20)) {
        fprintf(stderr, "usage: stdio_reader fopen|fdopen PATH SOURCE (a source of 1 MiB or more)\n");
        return 1;
    }
    FILE *fp;
    off_t start = 0;
    if (strcmp(argv[1], "fopen") == 0) {
        fp = fopen(argv[2], "rb");
    } else {
        int fd = open(argv[2], O_RDONLY);
        int d = fd < 0 ? -1 : dup(fd);
        start = 12345;
        if (d >= 0)
            lseek(d, start, SEEK_SET);
        fp = d < 0 ? NULL : fdopen(d, "rb");
        if (fp && setvbuf(fp, NULL, _IONBF, 0) != 0)
            printf("setvbuf _IONBF failed\n");
        if (fd >= 0)
            close(fd);
    }
    if (!fp) {
        printf("%s %s failed\n", argv[1], argv[2]);
        return 0;
    }
    int bad = check(fp, start);
    if (!bad && strcmp(argv[1], "fopen") == 0) {
        static char buf[4096];
        fp = freopen(argv[2], "rb", fp);
        bad = !fp || fread(buf, 1, sizeof buf, fp) != sizeof buf || !same(buf, 0, sizeof buf);
        if (bad)
            printf("freopen\n");
    }
    if (!bad)
        printf("ok\n");
    if (fp)
        fclose(fp);
    return 0;
}

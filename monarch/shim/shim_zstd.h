/* shim_zstd.h -- what shim_zstd.c (a compressed copy decoded in the application's own process
 * (libzstd, loaded with dlopen)) gives the shim's other parts; libzstd's entry points and its
 * state in this process are its own. Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_ZSTD_H
#define MONARCH_SHIM_ZSTD_H

typedef struct monarch_zstd_dctx monarch_zstd_dctx; /* ZSTD_DCtx, opaque */

/* libzstd's entry points in this process, loaded at the first frame found (shim_zpool.c decodes with them) */
static struct {
    unsigned (*version)(void);
    monarch_zstd_dctx *(*create)(void);
    size_t (*free)(monarch_zstd_dctx *);
    size_t (*decompress)(monarch_zstd_dctx *, void *, size_t, const void *, size_t);
    unsigned long long (*content_size)(const void *, size_t);
    unsigned (*is_error)(size_t);
    unsigned (*dict_id)(const void *, size_t);
    void *(*create_ddict)(const void *, size_t);
    size_t (*free_ddict)(void *);
    size_t (*decompress_ddict)(monarch_zstd_dctx *, void *, size_t, const void *, size_t, const void *);
} monarch_zstd;

/* ---- what the other parts call ---- */
static void monarch_zstd_init(void);
static void monarch_zstd_atfork_child(void);
static monarch_zstd_dctx *monarch_zstd_dctx_here(void);
static int monarch_zstd_open(unsigned probe, const char *key, size_t kl, int flags, int *found);

#endif /* MONARCH_SHIM_ZSTD_H */

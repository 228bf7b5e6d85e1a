/* shim_paths.h -- what shim_paths.c (paths: the absolute form and the key of a path, as the
 * kernel resolves it, and the probe directories opened once) gives the shim's other parts. Part
 * of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_PATHS_H
#define MONARCH_SHIM_PATHS_H

#define MONARCH_PROBE_UNOPENED (-1)
#define MONARCH_PROBE_OPENING (-2) /* one thread opens it; the others go by path meanwhile */
#define MONARCH_PROBE_BY_PATH (-3)

/* ---- what the other parts call ---- */
static size_t monarch_normalize(char *p);
static int monarch_abspath(int dirfd, const char *path, char *out, size_t *lenp);
static int monarch_has_dotdot(const char *p);
static int monarch_wants_dir(const char *path);
static int monarch_key_abs(int dirfd, const char *path, int allow_root, char *key, size_t *klp,
                           unsigned *kp, char *abs);
static int monarch_key(int dirfd, const char *path, char *key, size_t *klp);
static int monarch_probe_path(const struct monarch_probe *pr, const char *key, size_t kl, char *out);
static int monarch_probe_fd(struct monarch_probe *pr);
static int monarch_probe_fd_valid(struct monarch_probe *pr, int fd);
static void monarch_probe_dirs_check(void);
static void monarch_probe_dir_closing(unsigned first, unsigned last);
static void monarch_parse_shared(const char *list);

#endif /* MONARCH_SHIM_PATHS_H */

/* shim_daemon.h -- what shim_daemon.c (the daemon: a framed request, on the connection a thread
 * kept or a fresh one, and the wait for the snapshot index) gives the shim's other parts; each
 * thread's kept connection and the index's next look are its own. Part of monarch_shim.c's one
 * translation unit. */
#ifndef MONARCH_SHIM_DAEMON_H
#define MONARCH_SHIM_DAEMON_H

/* why a request went unanswered (monarch_request_why) */
enum monarch_unanswered { MONARCH_ANSWERED, MONARCH_BUSY, MONARCH_LOST };

/* ---- what the other parts call ---- */
static void monarch_conn_init(void);
static int monarch_request_why(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax,
                               int *fdp, int total_ms, int *why);
static int monarch_request(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax, int *fdp,
                           int total_ms);
static int monarch_answer_allowed(const char *path);
static int monarch_index_settle(void);
static inline int monarch_index_pending_extra(int s);
static void monarch_daemon_atfork_child(void);  /* shim_fork.c's child handler: the kept connection dropped */
/* the pieces of one exchange, for shim_pages.c's own (a fault's PAGES, on its thread's connection) */
static long monarch_now_ms(void);
static int monarch_connect(int tmo);
static int monarch_connect_to(const struct sockaddr_un *addr, int tmo);
static int monarch_exchange(int s, unsigned verb, unsigned flags, const char *key, size_t kl, char *body,
                            size_t bodymax, int *fdp, long start, long deadline, int *busy); /* one request */
static int monarch_recv_exact(int s, void *buf, size_t n, long deadline, int *fdp);
static uint32_t monarch_le32(const unsigned char *p);
static void monarch_conn_close_at_exit(void);

#endif /* MONARCH_SHIM_DAEMON_H */

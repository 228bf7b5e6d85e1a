/*
 * monarch_wire.h -- the one C definition of Monarch's wire: what the shim
 * (libmonarch_shim.so), the daemon's front door (libmonarch_front_door.so) and
 * the Python side (monarch/protocol.py) must agree on: socket frames, the
 * counters file, the snapshot index, the environment, and the limits the
 * stager and the front door share.
 *
 * Included by monarch/shim/monarch_shim.c and monarch/frontdoor/front_door.c.
 * tests/unit/test_wire.py reads every "#define MONARCH_" line here and checks it
 * against monarch/protocol.py (after Darshan's log-format headers: one
 * definition, every reader checked against it); the _Static_asserts below hold
 * the structs to the sizes and offsets Python's struct formats give.
 */
#ifndef MONARCH_WIRE_H
#define MONARCH_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* ---- counters file: little-endian uint64 words, added to atomically ---- */
#define MONARCH_COUNTERS_MAGIC 0x4D4F4E4152434801ULL
#define MONARCH_COUNTERS_VERSION 13 /* 4: EXTRA_PROCESSES; 5: EXTRA_ZSTD_REUSED; 6: EXTRA_EARLY_*, EXTRA_LOST_*;
                                     7: a slot's opens_stdio and mapped_bytes; 8: EXTRA_BLOCK_*;
                                     9: EXTRA_BLOCK_FAULT*; 10: EXTRA_BLOCK_FAULTS_PAGES;
                                     11: EXTRA_FALLBACKS, EXTRA_ROOTS_ELSEWHERE, EXTRA_ROOT_PROCESSES;
                                     12: EXTRA_META_UNCHECKED; 13: EXTRA_RAW_* */
#define MONARCH_MAX_SLOTS 16
#define MONARCH_HEADER_WORDS 3
/* per slot: opens; bytes read (read, pread, readv ..., fread); opens_uncounted (once per descriptor
 * whose bytes the shim cannot all see: mapped, or read through a FILE); of those, opens_stdio
 * (a FILE: stdio's own reads have no bound); mapped_bytes (the lengths mmap mapped: at most what
 * page faults read) */
#define MONARCH_SLOT_WORDS 5
#define MONARCH_RAW_NRS 16 /* the system calls EXTRA_RAW_BY_CALL counts apart */
#define MONARCH_EXTRA_WORDS (28 + 2 * MONARCH_RAW_NRS)
#define MONARCH_COUNTERS_WORDS (MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS + MONARCH_EXTRA_WORDS)
#define MONARCH_SLOT_PFS 0
#define MONARCH_SLOT_PEER 1
#define MONARCH_FIRST_TIER_SLOT 2
#define MONARCH_EXTRA_META_LOCAL 0
#define MONARCH_EXTRA_META_PFS 1
#define MONARCH_EXTRA_META_OFF 2
/* shim_zstd.c: opens decoded in the application's process, their ns and bytes; frames left to the daemon */
#define MONARCH_EXTRA_ZSTD_OPENS 3
#define MONARCH_EXTRA_ZSTD_NS 4
#define MONARCH_EXTRA_ZSTD_BYTES 5
#define MONARCH_EXTRA_ZSTD_FALLBACKS 6
/* processes in which the shim was active (counting on): +1 at start-up and in a fork child,
 * -1 when one replaces itself by exec (the new program counts itself if it loads the shim) */
#define MONARCH_EXTRA_PROCESSES 7
/* shim_zpool.c: of EXTRA_ZSTD_OPENS, those decoded into a reused memfd (its pages already there) */
#define MONARCH_EXTRA_ZSTD_REUSED 8
/* calls under a root sent to the PFS (also counted in slot PFS's opens or EXTRA_META_PFS) because
 * the snapshot index was not ready yet (EARLY: the daemon is walking; the shim looks again) or
 * because the daemon could not be reached or went silent (LOST: an INDEX or OPEN unanswered) */
#define MONARCH_EXTRA_EARLY_OPENS 9
#define MONARCH_EXTRA_EARLY_META 10
#define MONARCH_EXTRA_LOST_OPENS 11
#define MONARCH_EXTRA_LOST_META 12
/* shim_blocks.c: reads of a file staged by blocks (a descriptor on the PFS original whose staged
 * blocks are read from the local copy): bytes read from staged blocks, bytes read from the PFS;
 * opens of such files; bytes of their read-only mappings moved onto the local copy */
#define MONARCH_EXTRA_BLOCK_LOCAL_BYTES 13
#define MONARCH_EXTRA_BLOCK_PFS_BYTES 14
#define MONARCH_EXTRA_BLOCK_OPENS 15
#define MONARCH_EXTRA_BLOCK_REMAPPED_BYTES 16
/* shim_guard.c: a cluster's mappings: faults on a guarded block served from the copy once it came,
 * the ns they waited for it, and the faults whose block came late (its pages read from the PFS) */
#define MONARCH_EXTRA_BLOCK_FAULTS_HELD 17
#define MONARCH_EXTRA_BLOCK_FAULT_WAIT_NS 18
#define MONARCH_EXTRA_BLOCK_FAULTS_LATE 19
/* shim_pages.c: faults on a guarded block of another owner served with its pages, fetched from that
 * owner's copy through the daemon (VERB_PAGES), not read from the PFS */
#define MONARCH_EXTRA_BLOCK_FAULTS_PAGES 20
/* shim_view.c: what the application's view lacks of the daemon's, each a MONARCH_FALLBACK_* bit set
 * once (the process that sets it says it on stderr); bit k: root k names other files here than for
 * the daemon; processes that made a call under a root (the readers, not a runtime's wrappers) */
#define MONARCH_EXTRA_FALLBACKS 21
#define MONARCH_EXTRA_ROOTS_ELSEWHERE 22
#define MONARCH_EXTRA_ROOT_PROCESSES 23
/* bits as EXTRA_META_OFF's, the daemon's alone: root k's snapshot is not checked yet (a manifest read
 * without its directories' stats): its metadata is the PFS's until the daemon clears the bit */
#define MONARCH_EXTRA_META_UNCHECKED 24
/* shim_rawthreads.c: system calls made without libc that the shim answered (a SIGSYS each), the ns
 * its handler took, and the times a thread was paused in a compute runtime (its raw calls then made
 * at once); then MONARCH_RAW_NRS pairs (system call number + 1, calls): the first distinct calls of
 * the job, claimed by compare-and-swap (later ones counted in EXTRA_RAW_CALLS only) */
#define MONARCH_EXTRA_RAW_CALLS 25
#define MONARCH_EXTRA_RAW_NS 26
#define MONARCH_EXTRA_RAW_PAUSES 27
#define MONARCH_EXTRA_RAW_BY_CALL 28
#define MONARCH_FALLBACK_ROOT_ELSEWHERE 1u   /* a root is another filesystem object here: read directly */
#define MONARCH_FALLBACK_TIERS_UNSEEN 2u     /* no tier folder is the daemon's here: opens read the PFS */
#define MONARCH_FALLBACK_DAEMON_UNREACHABLE 4u /* the run folder or socket is not here: pass-through */
#define MONARCH_FALLBACK_UID_MISMATCH 8u     /* the daemon's files or socket are another uid's: pass-through */
#define MONARCH_FALLBACK_RAW_UNWATCHED 16u   /* raw system calls not watched in a process (shim_rawsys.c) */
#define MONARCH_FALLBACK_WB_LOST 32u         /* the daemon lost after it took write-back: changes refused (EIO) */

/* ---- socket frames: request u8 verb, u8 flags, u16 reserved, u32 length; answer i32 status, u32 length ---- */
#define MONARCH_VERB_OPEN 1
#define MONARCH_VERB_INVALIDATE 2
#define MONARCH_VERB_ATTACH 3
#define MONARCH_VERB_REPORT 4
#define MONARCH_VERB_STOP 5
#define MONARCH_VERB_HINT 6
#define MONARCH_VERB_INDEX 7
/* PAGES body: struct monarch_pages_request, then the key. Answered by the front door from the
 * block's owner (the C data path): status the bytes' count, the body the bytes; any other status
 * (or the Python server's refusal): not served, the shim reads the PFS. May ask REQUEST_KEEP. */
#define MONARCH_VERB_PAGES 8
#define MONARCH_PAGES_MAX (64 << 10) /* bytes one PAGES request asks for, at most */
/* a write-back call (monarch/writeback/wire.py): body = u8 op, then 4 NUL-ended fields (a path,
 * a second path, two decimal numbers); answer status = a WB_ANSWER_* or WB_ERRNO + errno */
#define MONARCH_VERB_WB 9
/* DESCRIBE key: the stat of a file the walk only listed (its record without a stat) taken by the daemon
 * into the index, for a metadata call the shim would otherwise send to the PFS every time: status 0
 * (it is described now), anything else (the PFS answers that call) */
#define MONARCH_VERB_DESCRIBE 10
#define MONARCH_WB_OPEN 1    /* path, flags, mode: open for writing (status: the file's seq; body: its local path) */
#define MONARCH_WB_CLOSE 2   /* n1 = seq: a descriptor of it closed */
#define MONARCH_WB_RESOLVE 3 /* path: where the job's file is (LOCAL / PFS with a path, or ENOENT) */
#define MONARCH_WB_RENAME 4  /* path, path2, n1 = 1: RENAME_NOREPLACE */
#define MONARCH_WB_UNLINK 5  /* path */
#define MONARCH_WB_MKDIR 6   /* path, n1 = mode */
#define MONARCH_WB_RMDIR 7   /* path */
#define MONARCH_WB_SYNC 8    /* n1 = seq: its bytes so far on the PFS under its name before the answer */
#define MONARCH_WB_LIST 9    /* path: a directory to list as the job sees it (the answer: a directory to open) */
#define MONARCH_WB_SETTLE 10 /* path, path2, n1 = SETTLE_*, n2 = chmod's mode: what the job changed there on the PFS
                              * first (or the file being written's local path, or DONE) */
#define MONARCH_WB_FMODE 11  /* n1 = seq, n2 = mode: fchmod of a file being written (its published mode) */
#define MONARCH_WB_ROOM 12   /* n1 = seq, n2 = bytes: room for the file's writes up to n2 (DONE: granted, maybe after
                              * a wait; SPILL: larger than the room, its bytes copied to the PFS path in the body) */
#define MONARCH_WB_SPILLED 13 /* n1 = seq, n2 = 1: the descriptor writes to the PFS path now (0: it could not) */
#define MONARCH_WB_CLOSE_SYNCED 14 /* as CLOSE, and this process wrote nothing to it since its last fsync */
#define MONARCH_WB_ANSWER_PFS 0 /* open, stat or list the path in the body (the PFS's) */
#define MONARCH_WB_ANSWER_DONE 1 /* SETTLE, FMODE: made in the view; the kernel is not asked */
#define MONARCH_WB_ANSWER_SPILL 2 /* ROOM: write the file through to the PFS path in the body */
#define MONARCH_WB_ANSWER_LOCAL 4096 /* RESOLVE, + mode: a pending file's copy at the path in the body, its mode this */
#define MONARCH_WB_SETTLE_OTHER 0
#define MONARCH_WB_SETTLE_TRUNCATE 1
#define MONARCH_WB_SETTLE_CHMOD 2
#define MONARCH_WB_RESOLVE_TO_READ 1 /* RESOLVE's n1: a read-only open (a kept copy of the unchanged PFS file will do) */
#define MONARCH_WB_ERRNO 65536  /* status - this: the errno the call fails with */
/* HINT body: u8 op, u64 stream, then the op's own; PROGRESS's is one u64 (positions consumed).
 * A connection whose first request is a PROGRESS of the order the front door's peer lane
 * follows is answered by the door itself, and kept (monarch.hints sends them on their own) */
#define MONARCH_HINT_PROGRESS 3
#define MONARCH_HINT_PROGRESS_BODY 17
#define MONARCH_INDEX_READY 0
#define MONARCH_INDEX_NONE 1
#define MONARCH_INDEX_WALKING 2 /* answer to a poll (INDEX with body INDEX_POLL): not ready yet */
#define MONARCH_INDEX_POLL "now" /* INDEX body: answer at once, never hold the request */
#define MONARCH_STATUS_PENDING (-2)
#define MONARCH_STATUS_ERROR (-1)
/* OPEN answer flag: the copy is the descriptor passed with the frame, sealed with
 * F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE */
#define MONARCH_ANSWER_FD 0x100
#define MONARCH_MEMFD_SEALS 0xf
/* OPEN answer flag: the file is being staged by blocks into the tier of the slot (the answer's
 * low bits): open the PFS original, and read its staged blocks from <probe dir>/BLOCKS_DIR/<key>
 * as <probe dir>/BLOCKMAP_DIR/<key> says (the body is empty) */
#define MONARCH_ANSWER_BLOCKS 0x400
/* OPEN request flag (its flags byte): keep this connection for the next OPEN if you can; an
 * answer that keeps it says so (ANSWER_KEPT: the next OPEN may be sent on it), any other
 * answer closes it (the Python server's, a door that does not know the flag hands it over) */
#define MONARCH_REQUEST_KEEP 0x1
#define MONARCH_ANSWER_KEPT 0x200
#define MONARCH_MAX_REQUEST 8192
#define MONARCH_MAX_ANSWER 1048576
#define MONARCH_REQUEST_HEADER_SIZE 8
#define MONARCH_ANSWER_HEADER_SIZE 8
#define MONARCH_HEARTBEAT_MS 250
#define MONARCH_HEARTBEAT_TIMEOUT_MS 1500
#define MONARCH_SHIM_TIMEOUT_MS_DEFAULT 60000
#define MONARCH_SHIM_INDEX_WAIT_MS_DEFAULT 300

/* ---- environment the launcher gives the application ---- */
#define MONARCH_ENV_ROOTS "MONARCH_ROOTS"
#define MONARCH_ENV_PROBE "MONARCH_PROBE"
#define MONARCH_ENV_SOCKET "MONARCH_SOCKET"
#define MONARCH_ENV_COUNTERS "MONARCH_COUNTERS"
#define MONARCH_ENV_INDEX "MONARCH_INDEX"
#define MONARCH_ENV_ASK_FIRST "MONARCH_ASK_FIRST"
#define MONARCH_ENV_STORE_ROOTS "MONARCH_STORE_ROOTS" /* roots with no PFS behind them (a key-value store) */
#define MONARCH_ENV_SHARED_SLOTS "MONARCH_SHARED_SLOTS" /* tiers shared with the user's other jobs: hits checked */
#define MONARCH_ENV_ROOT_IDS "MONARCH_ROOT_IDS"   /* "<k>=<dev>,<ino>:..." each root as the daemon sees it */
#define MONARCH_ENV_PROBE_IDS "MONARCH_PROBE_IDS" /* "<slot>=<dev>,<ino>:..." each tier folder as the daemon sees it */
#define MONARCH_ENV_SAID "MONARCH_SHIM_SAID" /* FALLBACK_* bits a parent process already said (no counters) */
#define MONARCH_ENV_WRITEBACK "MONARCH_WRITEBACK" /* the write-back paths, ':'-separated (the daemon's) */
#define MONARCH_ENV_WRITEBACK_MARKS "MONARCH_WRITEBACK_MARKS" /* the changed paths' filter (writeback/marks.py) */
#define MONARCH_ENV_WRITEBACK_SOCKET "MONARCH_WRITEBACK_SOCKET" /* the write-back calls' socket (node/writeback_door.py) */
#define MONARCH_WB_MARKS_MAGIC "MNWBMRK1"
#define MONARCH_WB_MARKS_HEADER_SIZE 16 /* the magic, u32 slots (a power of two), u32 0; then u8 counters */
#define MONARCH_ENV_DISABLE "MONARCH_DISABLE"
#define MONARCH_ENV_DEBUG "MONARCH_SHIM_DEBUG"
#define MONARCH_ENV_TIMEOUT "MONARCH_SHIM_TIMEOUT_MS"
#define MONARCH_ENV_INDEX_WAIT "MONARCH_SHIM_INDEX_WAIT_MS"
#define MONARCH_ENV_SHIM_ZSTD "MONARCH_SHIM_ZSTD"
#define MONARCH_ENV_MAP_GUARD "MONARCH_SHIM_MAP_GUARD" /* 0: a cluster's mappings are not guarded (shim_guard.c) */
#define MONARCH_ENV_RAW_SYSCALLS "MONARCH_SHIM_RAW_SYSCALLS" /* 1: raw system calls watched, 0: not (shim_rawsys.c) */

/* ---- how an open is served: the routes and the size thresholds that pick them, declared once
 * (monarch/routes.py is their Python half: its ROWS, in this order, and route_of, which decides
 * a file's route; tests/unit/test_routes.py holds the two equal). The rows are tried in order:
 * the first whose sizes take the file and whose rule holds (routes.py's _RULES) serves it. ---- */
#define MONARCH_INLINE_MAX (256 << 10)      /* a file this small is copied by the door or by its asker: no thread hand-off */
#define MONARCH_BLOCKS_MIN (16 << 20)       /* a file this large is staged by blocks: a whole copy would keep an open waiting */
#define MONARCH_RANGES_MIN (32 << 20)       /* a whole copy of a file this large is read in ranges, by several threads */
#define MONARCH_ONE_MESSAGE_MAX (4 << 20)   /* another node's file this small crosses the C data path in one message */
#define MONARCH_SIZE_ANY 0xFFFFFFFFFFFFFFFFULL /* no upper bound */

/* X(route, value, smallest size, largest size): who serves each is routes.py's table, in its order
 * (tried first, valued last: a value is an index entry's bits, never renumbered) */
#define MONARCH_ROUTES(X)                                                                       \
    X(MONARCH_ROUTE_WRITEBACK, 8, 0, MONARCH_SIZE_ANY)               /* a write-back create (shim_writeback.c) */ \
    X(MONARCH_ROUTE_PROBE, 0, 0, MONARCH_SIZE_ANY)                   /* a staged copy, opened by the shim */ \
    X(MONARCH_ROUTE_PEER_LANE, 1, 0, MONARCH_INLINE_MAX)             /* another node's: the door's peer lane */ \
    X(MONARCH_ROUTE_BLOCKS, 2, MONARCH_BLOCKS_MIN, MONARCH_SIZE_ANY) /* staged by blocks (shim_blocks.c), on every node */ \
    X(MONARCH_ROUTE_PEER, 3, 0, MONARCH_SIZE_ANY)                    /* another node's: Python's fetch */ \
    X(MONARCH_ROUTE_PFS, 4, 0, MONARCH_SIZE_ANY)                     /* the original: nothing copies it */ \
    X(MONARCH_ROUTE_STORE, 5, 0, MONARCH_SIZE_ANY)                   /* a store's value, copied by the stager */ \
    X(MONARCH_ROUTE_DOOR, 6, 0, MONARCH_INLINE_MAX)                  /* copied by the door: inline or its copiers */ \
    X(MONARCH_ROUTE_COPY, 7, 0, MONARCH_SIZE_ANY)                    /* a whole copy by the Python stager */

#define MONARCH_ROUTE_ENUM(route, value, smallest, largest) route = value,
enum monarch_route { MONARCH_ROUTES(MONARCH_ROUTE_ENUM) };
#define MONARCH_ROUTE_FITS(route, value, smallest, largest) \
    case route: return size - (uint64_t)(smallest) <= (uint64_t)(largest) - (uint64_t)(smallest);
/* Does the row of ``route`` take a file of ``size`` bytes? */
static inline int monarch_route_fits(enum monarch_route route, uint64_t size)
{
    switch (route) { MONARCH_ROUTES(MONARCH_ROUTE_FITS) }
    return 0;
}

/* ---- staging, shared by the stager and the front door ---- */
#define MONARCH_TMP_PREFIX ".monarch-tmp-" /* a copy being written: never served, swept as a leftover */

/* ---- a large file staged by blocks: written by the daemon (monarch/node/stage/blocks.py),
 * read by the shim (shim_blocks.c). The copy has the source's size, its blocks written in any
 * order; the map is its header, then one state byte per block. A block is STAGED only once its
 * bytes are all in the copy; the shim marks a block it read from the PFS WANTED (staged next). ---- */
#define MONARCH_BLOCKS_DIR ".blocks"
#define MONARCH_BLOCKMAP_DIR ".blockmap"
#define MONARCH_BLOCKMAP_MAGIC 0x50414D4B434F4C42ULL /* "BLOCKMAP" */
#define MONARCH_BLOCKMAP_VERSION 10
#define MONARCH_BLOCKMAP_HEADER_SIZE 120
/* after the state bytes, padded to 8: each block's owner, an int16 (a cluster's; -1: none to ask,
 * this node's own or alone), so a shim asks for another owner's pages by name (VERB_PAGES) */
#define MONARCH_BLOCKMAP_OWNERS_AT(blocks) (MONARCH_BLOCKMAP_HEADER_SIZE + (((blocks) + 7) & ~(uint64_t)7))
#define MONARCH_BLOCKMAP_SIZE(blocks) (MONARCH_BLOCKMAP_OWNERS_AT(blocks) + 2 * (uint64_t)(blocks))
#define MONARCH_RECORDS_YES 1 /* the map's records */
#define MONARCH_RECORDS_NO 2
#define MONARCH_BLOCK_ABSENT 0
#define MONARCH_BLOCK_WANTED 1
#define MONARCH_BLOCK_STAGED 2
#define MONARCH_BLOCK_FILLING 3 /* being read into the copy: by the daemon, or by a shim from a large read */
#define MONARCH_BLOCK_PLANNED 4 /* a file larger than its room: room held for it, read ahead next; a shim's read in
                                 * order fills it (FILLING) when it gets there first */
#define MONARCH_BLOCK_PASSED 5  /* a file larger than its room: a shim's read in order read it from the PFS (no room
                                 * was planned for it): staged last, once nothing else is left to stage */
#define MONARCH_BLOCK_LENT 6    /* a cluster's file larger than the room (the map's window): another owner's block,
                                 * in the copy for now. It may leave (ABSENT, then its bytes dropped): never mapped
                                 * from the copy, only read, and read right only if the map's evictions did not
                                 * change meanwhile (a reader loads evictions, then the state, reads, loads evictions) */

struct monarch_blockmap_header {
    uint64_t magic;
    uint32_t version, block_shift; /* a block is 1 << block_shift bytes (the last one may be shorter) */
    uint64_t size;                 /* the source's size and mtime, as the snapshot saw them */
    int64_t mtime_ns;
    uint64_t blocks;               /* state bytes after the header */
    uint64_t done;                 /* nonzero once the daemon stages no more of it (whole, out of room, failed) */
    uint64_t readaround;           /* nonzero: a fault of a mapping of the PFS reads around (long round trip) */
    uint64_t fill;                 /* nonzero: the file has room whole; a shim's large read of blocks not
                                    * staged fills them (FILLING, then STAGED once the bytes are in) */
    uint64_t wait_us;              /* nonzero (a cluster's): blocks not staged come from their owners' copies;
                                    * a large read of them waits up to this long for them before the PFS */
    uint64_t window;               /* nonzero (a cluster's, larger than the room): other owners' blocks are LENT,
                                    * the oldest leaving for the next one wanted; only a reader in order wants them */
    uint64_t evictions;            /* blocks that left so far: raised after a block's state, before its bytes go */
    uint64_t records;              /* a shim's find (0: none yet), once per file: MONARCH_RECORDS_YES, a mapping's
                                    * reader reads records of several pages at random (an LMDB's values): its
                                    * faults read around (unless the application advised the mapping itself),
                                    * and the read-ahead yields the link to them until it is done;
                                    * MONARCH_RECORDS_NO, it reads pages or in order */
    uint64_t pfs_reads;            /* raised by a shim at each of the application's reads of the PFS's file
                                    * (a read of blocks not staged, a fill): the daemon's read-ahead is not
                                    * alone on the link while these come (read_pace.py) */
    uint64_t mapped;               /* nonzero once a shim saw the PFS's file mapped: its faults read the PFS
                                    * unseen, so the read-ahead is never alone on the link for it */
    uint64_t room;                 /* the daemon's: the bytes of a shared set's ledger the copy holds */
};

/* VERB_PAGES's body (the key follows): bytes [offset, offset + length) of the large file of that key,
 * of this size and mtime (the map's), from node owner's staged blocks */
struct monarch_pages_request {
    uint64_t size;
    int64_t mtime_ns;
    uint64_t offset;
    uint32_t length;
    int32_t owner;
};

/* ---- snapshot index: written once by the daemon, its files described in place, mapped by every process ---- */
#define MONARCH_INDEX_MAGIC 0x58444E4948434E4DULL /* "MNCHINDX" */
#define MONARCH_INDEX_VERSION 11 /* 6: files listed, not yet described (INDEX_FLAG_UNDESCRIBED);
                                  * 7: a file's stat written when described;
                                  * 8: an 8-byte record per file, its name under its directory's range;
                                  * 9: a described file's stat in 8 bytes beside its directory's shape;
                                  *    a directory's files' names' common prefix and suffix stored once;
                                  * 10: buckets 3/2 of the keys (a multiple of 16, no power of 2):
                                  *    a key's first bucket (hash x buckets) >> 32;
                                  * 11: only the directories in the buckets: a file found by
                                  *    name in its directory's range */
#define MONARCH_INDEX_HEADER_SIZE 144
#define MONARCH_INDEX_ENTRY_SIZE 112
#define MONARCH_INDEX_FILE_SIZE 8
#define MONARCH_INDEX_CHILD_SIZE 24
#define MONARCH_INDEX_FLAG_SYMLINK 1
#define MONARCH_INDEX_FLAG_LISTED 2
/* an entry nothing is answered from: no file's record or stat has it (Python's view of a file not
 * described yet does); a fixed entry (a directory) with it is not answered from */
#define MONARCH_INDEX_FLAG_UNDESCRIBED 4
/* a file record's ``stat`` while the daemon describes it (0: not described; else its stat's slot) */
#define MONARCH_INDEX_DESCRIBING 0xFFFFFFFFu
/* A file record's ``stat`` above ``files`` (and not DESCRIBING): its short stat, at word stat - files - 1
 * of the shorts (room for 4 words a file, taken in turn: the header's shorts_used). Its first word:
 * bit 63 set; bits 0..18 the size (at most SHORT_MAX_SIZE, routes.py's INLINE_MAX: a larger file's
 * stat is a slot's, where the daemon finds the files past the door's row); bits 19..22 the route + 1;
 * 23..24 how its blocks follow from its size (SHORT_BLOCKS_*); 25..26 its times (SHORT_TIMES_*: the
 * words after the first); 27..62 its st_ino less its directory shape's, signed. The rest of its stat
 * is the shape's. */
#define MONARCH_INDEX_SHORT_ROOM 4
#define MONARCH_INDEX_SHORT_MAX_SIZE (256u << 10)
#define MONARCH_INDEX_SHORT_SIZE_BITS 19
#define MONARCH_INDEX_SHORT_ROUTE_AT 19
#define MONARCH_INDEX_SHORT_BLOCKS_AT 23
#define MONARCH_INDEX_SHORT_TIMES_AT 25
#define MONARCH_INDEX_SHORT_INO_AT 27
#define MONARCH_INDEX_SHORT_INO_BITS 36
/* the shape's times; its mtime next, its atime and ctime the same; its mtime then its atime, its
 * ctime the mtime; its mtime, atime and ctime next */
enum { MONARCH_SHORT_TIMES_SHAPE, MONARCH_SHORT_TIMES_M, MONARCH_SHORT_TIMES_MA, MONARCH_SHORT_TIMES_MAC };
enum { MONARCH_SHORT_BLOCKS_512, MONARCH_SHORT_BLOCKS_4096, MONARCH_SHORT_BLOCKS_BLKSIZE, MONARCH_SHORT_BLOCKS_NONE };
/* a shape's ``hash`` word: being written, then whole (its other fields: the stat files of its
 * directory share) */
#define MONARCH_INDEX_SHAPE_WRITING 1u
#define MONARCH_INDEX_SHAPE_READY 2u
/* the header's ``reserved`` word: a listing-mode walk made the index and described no file */
#define MONARCH_INDEX_LISTING 1
/* and: the inodes table is one u64, every file's (a listing that gave every name the same d_ino) */
#define MONARCH_INDEX_INOS_ONE 2
/* flags bits 8..11: a file's route + 1 (0: none published: a directory, a link's own record), the
 * route table's on the file's static facts (size, kind, store) and the node's: never another
 * node's (the owners of a sharded cluster are known after the index is written) */
#define MONARCH_INDEX_ROUTE_SHIFT 8
#define MONARCH_INDEX_ROUTE_MASK 0xF00

/* In the file in this order: header, buckets, file records (numbers 1..files), the directories'
 * file ranges, listed sizes and inodes (each optional), fixed entries (the numbers after:
 * directories, then link records), keys (the file names first), children, shapes (an INDEX_ENTRY a
 * directory), shorts (SHORT_ROOM u64 words a file), stats (room for ``files`` INDEX_ENTRYs, slot s
 * at stats_off + 112 * (s - 1)); the last three zeros until described, the shapes and the shorts
 * just before the stats (monarch_index_shapes_off). */
struct monarch_index_header {
    uint64_t magic;
    uint32_t version, entries, buckets, reserved;
    uint64_t buckets_off, entries_off, keys_off, keys_size, children_off, children_count;
    uint32_t files, stats_used;   /* stats_used: slots taken (atomic in the mapping, the daemon's process only) */
    uint64_t files_off, stats_off;
    uint64_t size;                /* the file's whole length: stats_off + 112 * files */
    uint32_t dirs, shorts_used;   /* directories: entries files + 1 .. files + dirs; the shorts' words taken (atomic) */
    uint64_t names_size;          /* the file names: the key bytes' first, file after file */
    uint64_t ranges_off;          /* u32[dirs + 1]: directory j holds files ranges[j] + 1 .. ranges[j + 1] */
    uint64_t sizes_off, inos_off; /* u64 per file, each 0 when absent: listed sizes; listing's d_ino */
};

/* File n's record (n - 1 at files_off): its name's offset in the key bytes (its length: up to the
 * next file's, the last's to names_size), and ``stat``: 0 not described, DESCRIBING, its stat's slot
 * (1..files), else its short stat (files + 1 + its first word), stored last (release; load acquire) */
struct monarch_index_file {
    uint32_t name_off, stat;
};

/* directory j's (from 0) at affixes_off + 8 j (after the ranges, at a multiple of 8): its files'
 * names' common prefix and common suffix, stored once in the key bytes at ``off`` (the prefix then
 * the suffix); each file's own name bytes are its middle, never empty */
struct monarch_index_affix {
    uint32_t off;
    uint16_t prefix, suffix;
};

/* the source's stat as the snapshot saw it, and where the key and its listing are */
struct monarch_index_entry {
    uint32_t hash, key_len;
    uint64_t key_off, size;
    int64_t mtime_ns, atime_ns, ctime_ns;
    uint64_t ino, dev;
    uint32_t mode, uid, gid, nlink;
    uint32_t flags, link; /* link: the number of a symlinked file's own lstat record */
    uint64_t blocks;
    uint32_t blksize, nchildren; /* a listed directory's child records: "." "..", then sorted names */
    uint64_t children;           /* its first child record; a file's stat: the file's number */
};

struct monarch_index_child {
    uint64_t d_ino, name_off;
    uint32_t entry;
    uint16_t name_len;
    uint8_t d_type, reserved;
};

/* Is ``route`` the route published in an index entry's ``flags``? */
static inline int monarch_index_routes(uint32_t flags, enum monarch_route route)
{
    return (flags & MONARCH_INDEX_ROUTE_MASK) >> MONARCH_INDEX_ROUTE_SHIFT == (uint32_t)route + 1u;
}

_Static_assert(sizeof(struct monarch_blockmap_header) == MONARCH_BLOCKMAP_HEADER_SIZE, "block map header layout");
_Static_assert(sizeof(struct monarch_pages_request) == 32, "pages request layout");
_Static_assert(sizeof(struct monarch_index_header) == MONARCH_INDEX_HEADER_SIZE, "index header layout");
_Static_assert(sizeof(struct monarch_index_entry) == MONARCH_INDEX_ENTRY_SIZE, "index entry layout");
_Static_assert(sizeof(struct monarch_index_child) == MONARCH_INDEX_CHILD_SIZE, "index child layout");
_Static_assert(sizeof(struct monarch_index_affix) == 8, "index affix layout");
_Static_assert(offsetof(struct monarch_index_entry, size) == 16, "index entry: size");
_Static_assert(offsetof(struct monarch_index_entry, mtime_ns) == 24, "index entry: mtime_ns");
_Static_assert(offsetof(struct monarch_index_entry, mode) == 64, "index entry: mode");
_Static_assert(offsetof(struct monarch_index_entry, flags) == 80, "index entry: flags");
_Static_assert(offsetof(struct monarch_index_entry, children) == 104, "index entry: children");
_Static_assert(offsetof(struct monarch_index_header, children_count) == 64, "index header: children_count");
_Static_assert(offsetof(struct monarch_index_header, files) == 72, "index header: files");
_Static_assert(offsetof(struct monarch_index_header, stats_used) == 76, "index header: stats_used");
_Static_assert(offsetof(struct monarch_index_header, files_off) == 80, "index header: files_off");
_Static_assert(offsetof(struct monarch_index_header, size) == 96, "index header: size");
_Static_assert(sizeof(struct monarch_index_file) == MONARCH_INDEX_FILE_SIZE, "index file record layout");
_Static_assert(offsetof(struct monarch_index_file, stat) == 4, "index file record: stat");
_Static_assert(offsetof(struct monarch_index_header, dirs) == 104, "index header: dirs");
_Static_assert(offsetof(struct monarch_index_header, inos_off) == 136, "index header: inos_off");
/* every route + 1 fits an index entry's route bits (published or not: WRITEBACK never is) */
#define MONARCH_ROUTE_BITS(route, value, smallest, largest) \
    _Static_assert((value) + 1 <= MONARCH_INDEX_ROUTE_MASK >> MONARCH_INDEX_ROUTE_SHIFT, "route bits: " #route);
MONARCH_ROUTES(MONARCH_ROUTE_BITS)

#endif

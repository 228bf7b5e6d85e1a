"""The contract between the C shim, the daemon's C front door, the node daemon and the launcher.

This is Python's definition of it. The C definition is one header,
``monarch/wire/monarch_wire.h``, which both C libraries include (the shim and the daemon's
front door); ``tests/unit/test_wire.py`` holds every constant of that header equal to this
module's (the frames' and the index's sizes among them: this module's struct formats) and
compiles the header, whose ``_Static_assert``s hold its structs to those sizes. What no C
code reads (the HINT frames' layout, REPORT's bodies, ...) is defined here alone;
``tests/unit/test_protocol.py`` checks this side.

Keys: a managed file's key is ``b"<k>/<path relative to root k>"`` as raw bytes (any byte
but NUL; newlines and non-UTF-8 bytes included). Python holds keys as ``str`` decoded with
``os.fsdecode`` (surrogateescape), so every name the filesystem allows round-trips.

Environment (set by ``monarch run`` for the application's process tree; the launcher
exports these keys only, never anything else a daemon says):
  MONARCH_ROOTS     dataset roots as ``<k>=<absolute dir>`` entries separated by ':'. Root k
                    may appear more than once: its canonical path (symlinks resolved) and
                    the spelling the configuration used (``/scratch`` -> ``/lustre/scratch``).
  MONARCH_PROBE     staged-copy directories the shim probes, fastest first, as
                    ``<slot>=<dir>`` pairs separated by ':'. A key is staged at ``<dir>/<key>``.
                    An OPEN answer must name a path inside one of these directories.
  MONARCH_SOCKET    the node daemon instance's Unix socket (``sock-<id>``; ``daemon.sock``,
                    where launchers find it, is a second name of it: monarch/node/instance.py).
  MONARCH_COUNTERS  the job's shared counters file (see below), ``counters-<id>``.
  MONARCH_INDEX     the snapshot index (see below): what ``fstat`` of a staged copy reports,
                    ``index-<id>``. The shim maps the counters and the index only if they
                    are regular files of its uid that no one else may write (opened
                    O_NOFOLLOW | O_NONBLOCK), and the index only if its tables lie inside it.
  MONARCH_ASK_FIRST=1  every managed open asks the daemon before it probes a tier
                    (``staging.validate: open``: the daemon checks the PFS at a file's first open).
  MONARCH_STORE_ROOTS  root indices (k,k,...) served from a key-value store: an open there that the
                    daemon cannot serve fails with EIO (there is no PFS file to fall back to).
  MONARCH_SHARED_SLOTS  tier slots (s,s,...) shared with the user's other jobs (copies checked).
  MONARCH_DISABLE=1 the shim passes everything through.
  MONARCH_SHIM_ZSTD  unset: the shim decodes compressed copies (<probe dir>/.z/<key>) itself
                    with the system's libzstd.so.1 when it is there; 0: it leaves them to the
                    daemon (OPEN, ANSWER_FD); another value: the library to load instead.
  MONARCH_SHIM_DEBUG=1..3  debug lines on stderr.
  MONARCH_SHIM_TIMEOUT_MS  the longest the shim waits for one answer (default below); a
                    daemon that sends nothing for HEARTBEAT_TIMEOUT_MS is given up sooner.
  MONARCH_SHIM_INDEX_WAIT_MS  the longest one call waits for the snapshot index when the
                    process started before the daemon's walk ended (INDEX, below; default
                    SHIM_INDEX_WAIT_MS_DEFAULT, a few hundred ms). Past it the call goes to the
                    PFS, counted (EXTRA_EARLY_*), and the process looks again, rate-limited
                    (the index file, and an INDEX poll now and then): it uses the index as
                    soon as it is written, never waiting longer than this per call.

Socket protocol: frames, little-endian, one request per connection for the shim, or
several OPENs one after another when the front door keeps the connection (REQUEST_KEEP).
  request  = u8 verb, u8 flags (0, or REQUEST_KEEP on an OPEN or PAGES), u16 reserved (0), u32 length,
             then ``length`` bytes (<= MAX_REQUEST; a key for OPEN and INVALIDATE, empty otherwise)
  answer   = i32 status, u32 length, then ``length`` bytes (length <= MAX_ANSWER)
  OPEN key        -> status = slot: SLOT_PFS (0, empty body: read the original) or a
                     staged slot with the path to open as body; while the daemon stages
                     it sends STATUS_PENDING frames (empty) every HEARTBEAT_MS, so a
                     stalled daemon is told from a slow copy. A path that is gone when the
                     shim opens it (ENOENT: evicted in between) is asked for once more, then
                     the PFS.
                     A compressed copy (a tier with ``compression``, docs/compression.md) is
                     answered ANSWER_FD | slot with an empty body and one descriptor passed
                     with the frame (SCM_RIGHTS, on the frame's bytes): a sealed memfd holding
                     the file's bytes (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL),
                     positioned at 0, for the application to use as its descriptor. The shim
                     accepts it only if it is a regular file, sealed so, of the index's size;
                     it closes any other descriptor that arrives and reads the PFS instead.
                     A shim without ANSWER_FD reads the PFS (fail open). By blocks: ANSWER_BLOCKS (stage/blocks.py).
                     An OPEN with REQUEST_KEEP asks that the connection stay open for the
                     next OPEN: the C front door answers ANSWER_KEPT | status when it keeps
                     it (it may close it later, idle: the shim then connects anew); any
                     answer without ANSWER_KEPT (the Python server's) closes it. A daemon
                     from before the flag refuses the frame: that OPEN reads the PFS.
  INVALIDATE key  -> status 0 once the node's copies of the key (or of everything under
                     it, for a directory) are gone and will not be served again this job:
                     the shim sends it before a write-open, rename, unlink or truncate.
  ATTACH          -> status 0, body JSON {"env": {...}, "run": {...}}; the connection is the launcher's
                     session: REPORT frames on it are answered, and the daemon counts it until it closes.
  REPORT          -> status 0, body JSON statistics. A full one (empty body or REPORT_FINAL) is held
                     until the snapshot is ready or has failed (heartbeats meanwhile) and, with write-back,
                     a REPORT_FINAL or one outside a session until the drain is done; a brief one never
                     waits: what is known (``"snapshot": "walking"``), the drain's progress (W7).
  INDEX           -> the snapshot index: status INDEX_READY (0) once the index file
                     (MONARCH_INDEX) is written and every tier copy the shim may probe has
                     been checked against the snapshot; INDEX_NONE (1) if the snapshot
                     failed (there will be no index this job: read the PFS). While the walk
                     runs the daemon holds the request and sends STATUS_PENDING heartbeats
                     (as for OPEN). The shim asks it once per process, at its first call
                     under a root, when the index was not there at its start.
                     With body INDEX_POLL the request is never held: INDEX_READY, INDEX_NONE,
                     or INDEX_WALKING (2: the walk goes on) at once; the front door answers it on
                     its own threads while the walk runs (no GIL): a busy daemon is told from a
                     lost one. The shim polls so, at most every few hundred ms, while it serves calls from the PFS.
  STOP            -> status 0, then the daemon shuts down.
  PAGES body      -> a guarded fault's pages of another owner's block (body: monarch_wire.h's struct
                     monarch_pages_request, then the key): the C front door's alone, Python refuses it.
  DESCRIBE key    -> status 0 once a file the walk only listed is described in the index (the front
                     door's lstat, else the daemon's): the shim's metadata call is then answered there.
  HINT body       -> status 0: an order hint from ``monarch.hints`` (the shim never sends
                     it). body = u8 op, u64 stream (the reader's id, any number it chose),
                     then by op:
                       HINT_ORDER (1)    keys, each u16 length + bytes: the first keys of the
                                         stream's next epoch, in the order it will read them
                       HINT_MORE (2)     keys as above: the order continues with these
                       HINT_PROGRESS (3) u64 n: the reader is done with the first n keys
                       HINT_END (4)      nothing: the reader has gone
                     A connection may send several HINT frames, each answered; closed after REQUEST idle seconds.
  Before the snapshot is ready: OPEN and INDEX (not an INDEX_POLL) are held (heartbeats), and answered when it
  is ready (OPEN: at most staging.resolve_timeout after it arrived, then PFS); INVALIDATE
  and HINT are answered at once and applied in order when the snapshot is ready (no copy
  is served before then, so nothing stale can be read in between). ATTACH, STOP and a
  brief REPORT never wait for the snapshot.
  Any malformed or oversized request is answered STATUS_ERROR (body: a reason) and closed.
  Both sides check the peer's uid (SO_PEERCRED): only the daemon's own user is served,
  and the shim and launcher talk only to a daemon of their own uid.

Counters file: little-endian uint64 words, written by the shim with atomic adds,
so counts survive forked workers that leave with ``_exit`` and processes that are killed.
  word 0: COUNTERS_MAGIC, word 1: COUNTERS_VERSION, word 2: MAX_SLOTS,
  then per slot SLOT_WORDS: opens, bytes (bytes read through read/pread/readv/preadv, and
  delivered by fread, on the descriptor or any duplicate: dup*, fcntl F_DUPFD*, fork),
  opens_uncounted (opens whose bytes the shim cannot all see: a FILE made with fopen or
  fdopen, which stdio may also read with its own internal reads, or a descriptor mapped with
  mmap; counted once per descriptor), opens_stdio (of those, the ones a FILE reads: their
  bytes have no upper bound), mapped_bytes (the lengths mmap mapped from the slot's
  descriptors: page faults read at most that),
  then EXTRA_WORDS of named counters (EXTRA_*). Slots: 0 = pfs, 1 = peer area, 2.. = tiers in order.

Snapshot index (written once by the daemon, atomically, mmap'd in the shim; version INDEX_VERSION, 11;
built and read in Python by monarch/index_layout.py). It appears only when the snapshot is ready
(walked, kept copies checked): a process that finds it at start maps it at once; one that does not
asks INDEX at its first need. A file costs its 8-byte record and its name's own bytes (stored once,
under its directory; what its directory's names share at their start and end stored once for the
directory); once described, its short stat (8 bytes and 8 a time of its own), or its
112-byte stat where it differs from its directory's shape in more than its size, its inode, its
blocks and its times. In the file in this order:
  header  INDEX_HEADER: u64 magic, u32 version, u32 entries (numbered: the files 1..files, then the
          directories, then the link records), u32 buckets, u32 reserved
          (INDEX_LISTING: a listing walk made it, no file described; INDEX_INOS_ONE: its inodes
          table is one u64, every file's), u64 offsets of the buckets, of the fixed entries, of
          the key bytes, u64 size of the key bytes, u64 offset and u64 number of the child
          records, u32 files, u32 stats used (the stats slots taken: atomic, in the mapping), u64
          offsets of the file records and of the stats, u64 size (the file's length: the rooms
          for the shorts and the stats are sparse; a copy or a pickle holds the used parts: up to
          the shorts' words used, and the stats used; while no stat is used, up to the shapes'
          offset), u32 directories, u32 shorts used (the shorts' words taken: atomic, in the
          mapping), u64 size of the names' middles (the key bytes' first), u64 offsets of the
          directories' file ranges, of the listed sizes (0: none) and of the listed inodes (0: none)
  buckets u32[buckets]: a directory's entry number, or 0 for empty; open addressing, linear
          probing (after the last bucket the first), starting at ``key_hash(key) * buckets >> 32``
          (the hash's place in [0, buckets): any count, no power of 2 to round up to); only the
          directories are keyed (a root: ``"<k>/"``): a file is found by a binary search of its
          directory's files, which lie in the bytewise order of their names (its key up to its last
          "/" is its directory's; a root's file's, "<k>/"); buckets: 3/2 x directories rounded up
          to a multiple of 16, at least 16
  files   INDEX_FILE each (file n is record n - 1): u32 name offset (in the key bytes), u32 stat (0:
          not described yet; INDEX_DESCRIBING: being described; 1..files: the slot of its stat;
          above: its short stat, at word stat - files - 1 of the shorts).
          The names' middles are the key bytes' first ``names size`` bytes, file after file: file
          n's runs to file n + 1's offset, the last file's to the names' size, never empty. A
          file's name is its directory's affix prefix, its middle and the affix suffix; its key is
          its directory's key, "/" unless that key ends with one, and its name. A listing walk or a manifest
          describes no file: each is described when first needed (an open, a stat) by the daemon,
          which writes its short stat in the next free words or its stat in the next free slot,
          then ``stat`` with a release store (readers load it first).
  ranges  u32[directories + 1], then zeros to a multiple of 8: directory j (entry files + 1 + j)
          holds the files ranges[j] + 1 .. ranges[j + 1]. Directories come in the bytewise order of
          their keys, each one's files in the bytewise order of their names; every file's directory
          (its key up to its last "/", a root "<k>/") has an entry (UNDESCRIBED if nothing else is
          known of it)
  affixes INDEX_AFFIX each directory (its ranges' order), at the ranges' end rounded up to a
          multiple of 8: u32 offset in the key bytes, u16 prefix length, u16 suffix length: the
          common prefix and suffix of its files' names, stored once there (the prefix, then the
          suffix); none under two files, and every name longer than both (its middle a byte at least)
  sizes   (if its offset is not 0) u64 each file: its listed size (a manifest's), its stat's once
          described; without it a file's size is its stat's, 0 before
  inodes  (if its offset is not 0: an index with a listed directory) u64 each file: its name's d_ino
          in its directory's listing (0: its directory is not listed); with INDEX_INOS_ONE, one u64:
          every file's (a FUSE filesystem's listings give every name the same unknown inode)
  entries INDEX_ENTRY each, number m > files at (m - files - 1): u32 hash, u32 key length, u64
          key offset, u64 size, i64 mtime_ns, i64 atime_ns, i64 ctime_ns, u64 ino, u64 dev, u32
          mode, u32 uid, u32 gid, u32 nlink: the source's own ``stat`` as the snapshot saw it (a
          symlink's target's), then u32 flags, u32 link (the number of a symlinked file's link
          record, or 0), u64 blocks, u32 blksize, u32 children (how many child records a listed
          directory has), u64 first child record (a file's stat: the file's number).
          Flags: INDEX_FLAG_SYMLINK: the name itself is a symlink (to a file), so an
          ``O_NOFOLLOW`` open of it fails and is left to the kernel, and ``lstat`` answers its
          ``link`` record; INDEX_FLAG_LISTED: a directory whose every name the walk saw (its child
          records and its files are its whole listing, a name not among them does not exist);
          INDEX_FLAG_UNDESCRIBED: an entry nothing is answered from (in Python, a file's view
          before its stat); INDEX_ROUTE_MASK: a file's route + 1 (routes.py's, on its static
          facts), 0 none. The directories come first, then the link records (not keyed; a link
          record's key fields as its file's stat's: hash 0, the length and offset of its file's
          name's middle; its first child record its file's number).
  keys    the file names' middles, the directories' keys, the names of listed children that are no
          entry's, each once, then the directories' affixes; not NUL-terminated, then zeros to a
          multiple of 8
  children INDEX_CHILD each, per listed directory contiguous: u64 d_ino, u64 name offset
          (in the key bytes), u32 entry number of the child (0: a name the index does not
          describe: a symlink to a directory, a broken link, a special file), u16 name
          length, u8 d_type, u8 reserved. A directory's records are "." and ".." first (their
          d_ino the directory's and its parent's st_ino), then its names that are not its files
          (its subdirectories, names not described), sorted bytewise; then zeros to a multiple of
          8. Its listing is those names and its files (d_type DT_REG, DT_LNK for one whose name is
          a symlink; d_ino its inode in ``inodes``), merged in bytewise order.
  shapes  an INDEX_ENTRY a directory, zeros until the first regular file of that directory is
          described in a slot: then the fields its files share (dev, mode, uid, gid, nlink, the
          times, blksize; its inode the base of its files'), written once, its hash word
          INDEX_SHAPE_WRITING then INDEX_SHAPE_READY (a release store; readers load it first). They
          end where the shorts start: stats offset - 8 x INDEX_SHORT_ROOM x files - INDEX_ENTRY's
          size x directories
  shorts  room for INDEX_SHORT_ROOM u64 words a file, taken in turn (shorts used), read only from
          a record: a short stat's first word has bit 63 set, bits 0..18 the size (at most
          INDEX_SHORT_MAX_SIZE), 19..22 the route + 1, 23..24 its blocks from its size (0:
          ceil(size / 512); 1: ceil(size / 4096) x 8; 2: by its blksize; 3: none), 25..26 its times
          (0: the shape's, no more words; 1: its mtime next, its atime and ctime the same; 2: its
          mtime and atime next, its ctime its mtime; 3: its mtime, atime and ctime next), 27..62
          its st_ino less its directory shape's (signed); the rest of its stat is the shape's. A
          describer takes its words, writes them, then the record's stat (release). A file whose stat
          differs otherwise, or larger, or the shape's own, or once the room is taken, takes a slot.
          The stats offset - 8 x INDEX_SHORT_ROOM x files
  stats   room for an INDEX_ENTRY a file: slot s at (s - 1), a described file's stat (its key
          fields: hash 0, the length and offset of its name's middle; its first child record its
          number: a slot that does not name the file back is not its stat). The files a writer describes as it
          writes the index (a full walk) take slots 1.. in their order.
  key_hash is CRC-32 (zlib's, polynomial 0xEDB88320) of the key bytes.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import zlib
from typing import Iterable

COUNTERS_MAGIC = 0x4D4F4E4152434801  # "MONARCH" + 0x01
COUNTERS_VERSION = 13  # raised with every word added: a shim and a daemon of other versions never share one
SLOT_FIELDS = ("opens", "bytes", "opens_uncounted", "opens_stdio", "mapped_bytes")  # a slot's words, in order
MAX_SLOTS = 16
HEADER_WORDS = 3
SLOT_WORDS = len(SLOT_FIELDS)
RAW_NRS = 16  # (system call number + 1, calls) pairs after EXTRA_RAW_BY_CALL
EXTRA_WORDS = 28 + 2 * RAW_NRS
EXTRA_META_LOCAL = 0  # metadata calls answered from the snapshot
EXTRA_META_PFS = 1    # metadata calls on managed paths sent to the PFS
EXTRA_META_OFF = 2    # bit k (k < 63; 63: every k >= 63): the job changed root k (set by the shim before): metadata PFS's
EXTRA_ZSTD_OPENS = 3      # opens of compressed copies decoded by the shim in the application's process
EXTRA_ZSTD_NS = 4         # ns those opens took (frame open to sealed memfd): what compression costs a read
EXTRA_ZSTD_BYTES = 5      # bytes they decoded
EXTRA_ZSTD_FALLBACKS = 6  # compressed copies the shim found but left to the daemon (no dictionary, a bad frame)
EXTRA_PROCESSES = 7       # processes where the shim was active: +1 at its start and in a fork child, -1 at exec
EXTRA_ZSTD_REUSED = 8     # of EXTRA_ZSTD_OPENS, those decoded into a reused memfd (its pages already there)
# calls under a root sent to the PFS (also counted in slot PFS's opens, or EXTRA_META_PFS) because ...
EXTRA_EARLY_OPENS, EXTRA_EARLY_META = 9, 10  # ... the snapshot index was not ready yet (the daemon walks)
EXTRA_LOST_OPENS, EXTRA_LOST_META = 11, 12   # ... the daemon could not be reached or went silent
EXTRA_BLOCK_LOCAL_BYTES, EXTRA_BLOCK_PFS_BYTES = 13, 14  # files staged by blocks: bytes read from the copy, the PFS
EXTRA_BLOCK_OPENS, EXTRA_BLOCK_REMAPPED_BYTES = 15, 16   # ... their opens, bytes of mappings moved onto the copy
# guarded maps (shim_guard.c): faults served from the copy, their wait, read from the PFS; served with pages (shim_pages.c)
EXTRA_BLOCK_FAULTS_HELD, EXTRA_BLOCK_FAULT_WAIT_NS, EXTRA_BLOCK_FAULTS_LATE, EXTRA_BLOCK_FAULTS_PAGES = 17, 18, 19, 20
# shim_view.c: FALLBACK_* bits said; bit k: root k named other files; processes that called under a root
EXTRA_FALLBACKS, EXTRA_ROOTS_ELSEWHERE, EXTRA_ROOT_PROCESSES = 21, 22, 23
EXTRA_META_UNCHECKED = 24  # bits as META_OFF's: root k's snapshot not checked yet (a manifest's): metadata the PFS's
# shim_rawthreads.c: raw system calls answered, the ns their handler took, threads paused in a compute runtime;
# then RAW_NRS pairs (number + 1, calls) of the first distinct calls
EXTRA_RAW_CALLS, EXTRA_RAW_NS, EXTRA_RAW_PAUSES, EXTRA_RAW_BY_CALL = 25, 26, 27, 28
FALLBACK_ROOT_ELSEWHERE, FALLBACK_TIERS_UNSEEN, FALLBACK_DAEMON_UNREACHABLE, FALLBACK_UID_MISMATCH = 1, 2, 4, 8
FALLBACK_RAW_UNWATCHED, FALLBACK_WB_LOST = 16, 32  # raw calls unwatched (shim_rawsys.c); the daemon lost holding writes
COUNTERS_SIZE = 8 * (HEADER_WORDS + SLOT_WORDS * MAX_SLOTS + EXTRA_WORDS)

SLOT_PFS, SLOT_PEER, FIRST_TIER_SLOT = 0, 1, 2
MAX_TIERS = MAX_SLOTS - FIRST_TIER_SLOT

SHIM_TIMEOUT_MS_DEFAULT = 60_000
SHIM_INDEX_WAIT_MS_DEFAULT = 300  # per call: a first stat is answered (from the PFS) within it, walk or not
HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 250, 1500

ENV_ROOTS = "MONARCH_ROOTS"
ENV_PROBE = "MONARCH_PROBE"
ENV_SOCKET = "MONARCH_SOCKET"
ENV_COUNTERS = "MONARCH_COUNTERS"
ENV_INDEX = "MONARCH_INDEX"
ENV_ASK_FIRST = "MONARCH_ASK_FIRST"
ENV_SHARED_SLOTS = "MONARCH_SHARED_SLOTS"  # tier slots shared with the user's other jobs (see above)
ENV_STORE_ROOTS = "MONARCH_STORE_ROOTS"
# each root's and tier folder's device and inode as the daemon sees them; FALLBACK_* bits already said
ENV_ROOT_IDS, ENV_PROBE_IDS, ENV_SAID = "MONARCH_ROOT_IDS", "MONARCH_PROBE_IDS", "MONARCH_SHIM_SAID"
ENV_DISABLE, ENV_WRITEBACK = "MONARCH_DISABLE", "MONARCH_WRITEBACK"
ENV_WRITEBACK_MARKS = "MONARCH_WRITEBACK_MARKS"  # the paths the shim asks the daemon for (writeback/marks.py)
ENV_WRITEBACK_SOCKET = "MONARCH_WRITEBACK_SOCKET"  # where the shim's write-back calls go (node/writeback_door.py)
ENV_INDEX_WAIT = "MONARCH_SHIM_INDEX_WAIT_MS"
ENV_SHIM_ZSTD = "MONARCH_SHIM_ZSTD"
ENV_MAP_GUARD = "MONARCH_SHIM_MAP_GUARD"  # 0: a cluster's mappings are not guarded: their faults read the PFS
ENV_RAW_SYSCALLS = "MONARCH_SHIM_RAW_SYSCALLS"  # 1: raw system calls watched; 0: not (default: under write-back)
# what a launcher takes from a daemon's ATTACH answer; nothing else
CLIENT_ENV_KEYS = (ENV_ROOTS, ENV_PROBE, ENV_SOCKET, ENV_COUNTERS, ENV_INDEX, ENV_ASK_FIRST, ENV_STORE_ROOTS,
                   ENV_SHARED_SLOTS, ENV_ROOT_IDS, ENV_PROBE_IDS, ENV_WRITEBACK, ENV_WRITEBACK_MARKS,
                   ENV_WRITEBACK_SOCKET)

# -- socket frames --------------------------------------------------------------------
VERB_OPEN, VERB_INVALIDATE, VERB_ATTACH, VERB_REPORT, VERB_STOP, VERB_HINT, VERB_INDEX = 1, 2, 3, 4, 5, 6, 7
VERB_PAGES, PAGES_MAX = 8, 64 << 10  # a guarded fault's pages of another owner's block (at most): the door's
VERB_WB, VERB_DESCRIBE = 9, 10  # a write-back call (monarch/writeback/wire.py); a listed file's stat: 0 taken
VERBS = {VERB_OPEN: "OPEN", VERB_INVALIDATE: "INVALIDATE", VERB_ATTACH: "ATTACH", VERB_REPORT: "REPORT", VERB_STOP: "STOP",
         VERB_HINT: "HINT", VERB_INDEX: "INDEX", VERB_PAGES: "PAGES", VERB_WB: "WB", VERB_DESCRIBE: "DESCRIBE"}

INDEX_READY = 0             # INDEX answers: the index is written, map it
INDEX_NONE = 1              # the snapshot failed: no index this job (read the PFS)
INDEX_WALKING = 2           # a poll's answer: not ready yet (the walk goes on)
INDEX_POLL = "now"          # INDEX body: answer at once (READY, NONE or WALKING), never hold

HINT_ORDER, HINT_MORE, HINT_PROGRESS, HINT_END = 1, 2, 3, 4
HINT_HEADER = struct.Struct("<BQ")
HINT_KEY = struct.Struct("<H")

REPORT_BRIEF = b"brief"     # a REPORT body: the counters only (no timeline, no size classes)
REPORT_FINAL = b"final"     # a REPORT body: the whole report, and this session is done (it closes next)

STATUS_PENDING, STATUS_ERROR = -2, -1
REQUEST_KEEP = 0x1         # OPEN and PAGES request flag: keep the connection for the next request if you can
ANSWER_KEPT = 0x200         # OPEN answer flag: kept (only the C front door keeps one; Python closes)
ANSWER_FD = 0x100           # OPEN answer flag: the copy comes as a descriptor (SCM_RIGHTS)
ANSWER_BLOCKS = 0x400       # OPEN answer flag: staged by blocks (node/stage/blocks.py: its copy and map)
MEMFD_SEALS = 0x1 | 0x2 | 0x4 | 0x8  # F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE

MAX_REQUEST = 8192          # a key: root index, '/', a path of up to PATH_MAX (4096)
MAX_ANSWER = 1 << 20        # REPORT and ATTACH bodies; an OPEN answer's path is < PATH_MAX
REQUEST_HEADER, ANSWER_HEADER = struct.Struct("<BBHI"), struct.Struct("<iI")


class ProtocolError(ValueError):
    """A frame that breaks the contract (wrong verb, too long, truncated)."""


def encode_request(verb: int, body: bytes = b"") -> bytes:
    if len(body) > MAX_REQUEST:
        raise ProtocolError(f"request body of {len(body)} bytes exceeds {MAX_REQUEST}")
    return REQUEST_HEADER.pack(verb, 0, 0, len(body)) + body


def decode_request_header(header: bytes) -> tuple[int, int]:
    """(verb, body length) of an 8-byte request header; ProtocolError if it is not one."""
    verb, flags, reserved, length = REQUEST_HEADER.unpack(header)
    if verb not in VERBS or flags & ~REQUEST_KEEP or (flags and verb not in (VERB_OPEN, VERB_PAGES)) or reserved:
        raise ProtocolError(f"unknown request (verb {verb}, flags {flags}, reserved {reserved})")
    if length > MAX_REQUEST:
        raise ProtocolError(f"request body of {length} bytes exceeds {MAX_REQUEST}")
    return verb, length


def encode_hints(op: int, stream: int, keys: Iterable[bytes] = (), consumed: int = 0) -> list[bytes]:
    """The HINT request frames for one hint: a long order is split over several frames
    (HINT_ORDER, then HINT_MORE), each within MAX_REQUEST."""
    head = HINT_HEADER.pack(op, stream)
    if op == HINT_PROGRESS:
        return [encode_request(VERB_HINT, head + struct.pack("<Q", consumed))]
    if op == HINT_END:
        return [encode_request(VERB_HINT, head)]
    frames, parts, size = [], [head], len(head)
    for raw in keys:
        item = HINT_KEY.pack(len(raw)) + raw
        if len(head) + len(item) > MAX_REQUEST:
            raise ProtocolError(f"a key of {len(raw)} bytes does not fit a HINT frame")
        if size + len(item) > MAX_REQUEST:
            frames.append(encode_request(VERB_HINT, b"".join(parts)))
            head = HINT_HEADER.pack(HINT_MORE, stream)
            parts, size = [head], len(head)
        parts.append(item)
        size += len(item)
    frames.append(encode_request(VERB_HINT, b"".join(parts)))
    return frames


def decode_hint(body: bytes) -> tuple[int, int, list[str] | int | None]:
    """(op, stream, keys | consumed | None) of a HINT body; ProtocolError if malformed."""
    if len(body) < HINT_HEADER.size:
        raise ProtocolError("HINT body shorter than its header")
    op, stream = HINT_HEADER.unpack_from(body)
    pos = HINT_HEADER.size
    if op == HINT_PROGRESS:
        if len(body) != pos + 8:
            raise ProtocolError("HINT progress takes one u64")
        return op, stream, struct.unpack_from("<Q", body, pos)[0]
    if op == HINT_END:
        if len(body) != pos:
            raise ProtocolError("HINT end takes no body")
        return op, stream, None
    if op not in (HINT_ORDER, HINT_MORE):
        raise ProtocolError(f"unknown HINT op {op}")
    keys = []
    while pos < len(body):
        if pos + HINT_KEY.size > len(body):
            raise ProtocolError("HINT key length truncated")
        (n,) = HINT_KEY.unpack_from(body, pos)
        pos += HINT_KEY.size
        if n == 0 or pos + n > len(body):
            raise ProtocolError("HINT key empty or truncated")
        keys.append(key_str(body[pos:pos + n]))
        pos += n
    return op, stream, keys


def encode_answer(status: int, body: bytes = b"") -> bytes:
    return ANSWER_HEADER.pack(status, len(body)) + body


def key_bytes(key: str) -> bytes:
    return os.fsencode(key)


def key_str(raw: bytes) -> str:
    return os.fsdecode(raw)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (the socket's own timeout applies); ProtocolError on early close."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_answer(sock: socket.socket, limit: int = MAX_ANSWER) -> tuple[int, bytes]:
    """The next answer that is not a heartbeat: (status, body)."""
    while True:
        status, length = ANSWER_HEADER.unpack(recv_exact(sock, ANSWER_HEADER.size))
        if length > limit:
            raise ProtocolError(f"answer body of {length} bytes exceeds {limit}")
        body = recv_exact(sock, length) if length else b""
        if status != STATUS_PENDING:
            return status, body


def tier_slot(index: int) -> int:
    return FIRST_TIER_SLOT + index


def format_roots(roots: Iterable[tuple[int, str]]) -> str:
    return ":".join(f"{k}={path}" for k, path in roots)


def format_probe(probe: Iterable[tuple[int, str]]) -> str:
    return ":".join(f"{slot}={path}" for slot, path in probe)


def format_ids(ids: Iterable[tuple[int, int, int]]) -> str:  # (k, device, inode): "<k>=<dev>,<ino>:..."
    return ":".join(f"{k}={dev},{ino}" for k, dev, ino in ids)


# -- counters ---------------------------------------------------------------------------
def create_counters(path: str) -> None:
    """Create a zeroed counters file (atomically: the shim may map it at any time)."""
    from monarch.secure import write_file_atomically
    header = struct.pack("<3Q", COUNTERS_MAGIC, COUNTERS_VERSION, MAX_SLOTS)
    write_file_atomically(path, header + b"\0" * (COUNTERS_SIZE - len(header)))


def read_counters(path: str) -> list[tuple[int, ...]]:
    """A slot's words (SLOT_FIELDS: opens, bytes, opens_uncounted, opens_stdio, mapped_bytes) per
    slot, as the shim has counted them so far."""
    words = _counter_words(path)
    body = words[HEADER_WORDS:]
    return [tuple(body[SLOT_WORDS * i: SLOT_WORDS * (i + 1)]) for i in range(MAX_SLOTS)]


def read_extra_counters(path: str) -> tuple[int, ...]:
    """The EXTRA_WORDS named counters (EXTRA_*)."""
    return _counter_words(path)[HEADER_WORDS + SLOT_WORDS * MAX_SLOTS:]


def _counter_words(path: str) -> tuple[int, ...]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), COUNTERS_SIZE, access=mmap.ACCESS_READ) as m:
        words = struct.unpack(f"<{COUNTERS_SIZE // 8}Q", m[:COUNTERS_SIZE])
    if words[0] != COUNTERS_MAGIC or words[1] != COUNTERS_VERSION:
        raise ValueError(f"{path}: not a Monarch counters file of version {COUNTERS_VERSION}")
    return words


def slot_names(tier_names, with_peer: bool) -> dict[int, str]:
    """The report's name of each slot in use: ``pfs``, ``peer`` (clusters), then the tiers."""
    names = {SLOT_PFS: "pfs"}
    if with_peer:
        names[SLOT_PEER] = "peer"
    names.update({tier_slot(i): name for i, name in enumerate(tier_names)})
    return names


def read_opened_from(path: str, names: dict[int, str]) -> dict[str, dict[str, int]]:
    """A slot's counts (SLOT_FIELDS) per named slot opens were served from (the report's
    ``opened_from``); zeros when the counters file is gone or foreign."""
    try:
        counters = read_counters(path)
    except (OSError, ValueError):
        counters = [(0,) * SLOT_WORDS] * MAX_SLOTS
    return {name: dict(zip(SLOT_FIELDS, counters[slot])) for slot, name in sorted(names.items())}

# -- snapshot index -------------------------------------------------------------------------
INDEX_MAGIC = 0x58444E4948434E4D  # "MNCHINDX"
INDEX_VERSION = 11  # 6: UNDESCRIBED files; 7: a file's stat once described; 8: names under their directories;
# 9: a described file's stat in a short word beside its directory's shape; 10: buckets 3/2 of the keys (any count);
# 11: only the directories in the buckets (a file found by name in its directory's range)
INDEX_HEADER = struct.Struct("<QIIIIQQQQQQIIQQQIIQQQQ")
INDEX_FILE = struct.Struct("<II")
INDEX_ENTRY = struct.Struct("<IIQQqqqQQIIIIIIQIIQ")
INDEX_CHILD = struct.Struct("<QQIHBB")
INDEX_AFFIX = struct.Struct("<IHH")
INDEX_DESCRIBING = 0xFFFFFFFF  # an INDEX_FILE's stat while the daemon describes it
INDEX_SHORT_ROOM = 4  # the shorts' room: u64 words a file (a short stat takes 1 to 4, in turn)
INDEX_SHORT_MAX_SIZE = 256 << 10  # the largest file a short stat holds (routes.INLINE_MAX: the door's row)
INDEX_SHORT_SIZE_BITS, INDEX_SHORT_ROUTE_AT, INDEX_SHORT_BLOCKS_AT = 19, 19, 23
INDEX_SHORT_TIMES_AT, INDEX_SHORT_INO_AT, INDEX_SHORT_INO_BITS = 25, 27, 36
INDEX_SHAPE_WRITING, INDEX_SHAPE_READY = 1, 2  # a shape's first word (its hash's place)
INDEX_FLAG_SYMLINK, INDEX_FLAG_LISTED, INDEX_FLAG_UNDESCRIBED = 1, 2, 4
INDEX_LISTING = 1  # INDEX_HEADER's reserved word: a listing-mode walk made it, every file undescribed
INDEX_INOS_ONE = 2  # and: its inodes table is one u64, every file's (each name listed with the same d_ino)
INDEX_ROUTE_SHIFT, INDEX_ROUTE_MASK = 8, 0xF00  # flags bits 8..11: a file's route + 1 (0: none published)

DT_UNKNOWN, DT_FIFO, DT_CHR, DT_DIR, DT_BLK, DT_REG, DT_LNK, DT_SOCK = 0, 1, 2, 4, 6, 8, 10, 12  # <dirent.h>


def d_type_of(mode: int) -> int:
    """The d_type readdir gives for an entry of this st_mode."""
    import stat as _stat
    for test, value in ((_stat.S_ISREG, DT_REG), (_stat.S_ISDIR, DT_DIR), (_stat.S_ISLNK, DT_LNK),
                        (_stat.S_ISFIFO, DT_FIFO), (_stat.S_ISSOCK, DT_SOCK), (_stat.S_ISCHR, DT_CHR),
                        (_stat.S_ISBLK, DT_BLK)):
        if test(mode):
            return value
    return DT_UNKNOWN


def key_hash(raw: bytes) -> int:
    return zlib.crc32(raw) & 0xFFFFFFFF

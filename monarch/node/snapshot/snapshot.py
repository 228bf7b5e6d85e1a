"""The dataset snapshot: every managed file's and directory's key, its source's ``stat`` and
every directory's listing, from one tree walk.

A key is ``"<root index>/<path relative to that root>"`` (see monarch/protocol.py), decoded
with ``os.fsdecode`` so that any name the filesystem allows (newlines, non-UTF-8 bytes,
255-byte names) is a key. The snapshot is the job's view of the dataset: what the
stager checks a source against before copying it, and what ``fstat`` of a staged copy
reports (through the index the shim maps), and what the shim answers ``stat``, ``access``
and directory listings under a root from, without asking the PFS.

Reuse across jobs (``load_or_walk``): the index of the last walk of the same dataset is
kept in the user's private snapshot directory, keyed by the dataset id. A later job reuses
it when every directory it lists still has the same inode, mtime and ctime (one ``stat``
per directory instead of a ``stat`` per file): a name added, removed or renamed changes
its directory's mtime. A file rewritten in place under the same name does not, so such a
change is not seen by a reused snapshot (the stager still checks size and mtime before
it copies); ``staging.validate: open`` always walks afresh.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
from dataclasses import dataclass, field
from typing import Callable

from monarch import protocol
from monarch.index_layout import check_tables
from monarch.node.snapshot import index_writer
from monarch.node.snapshot import walker
from monarch.node.snapshot.index_file import IndexFile
from monarch.records.filetable import DirInfo, FileInfo, FileTable, Listing
from monarch.node.snapshot.indextable import IndexListing, IndexTable, files_in, index_size, used_end, used_ranges
from monarch.node.snapshot.pfsmeta import lstats_under_roots, opened_stat
from monarch.secure import write_file_atomically

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    roots: tuple[str, ...]
    # an IndexTable where the C walk or a kept index made it (the index is the table), a
    # FileTable (compact) where the Python walk did
    files: "IndexTable | FileTable | dict[str, FileInfo]"
    dirs: dict[str, DirInfo] = field(default_factory=dict)   # "<k>/" is root k itself
    links: dict[str, FileInfo] = field(default_factory=dict)  # a symlinked file's own lstat
    # the file the index was built in, mapped (``files.data``), until ``publish_index`` renames it
    index_file: IndexFile | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_index(cls, roots: tuple[str, ...], data, nfiles: int, index_file: IndexFile | None = None) -> "Snapshot":
        """The snapshot whose index is ``data`` (a writable buffer: a bytearray, or ``index_file``'s
        mapping; its first ``nfiles`` entries are the files): the files read from the index
        itself, the directories and links as objects (few)."""
        table = IndexTable(data, nfiles, index_writer.Describer(roots))
        dirs, links = {}, {}
        for n in range(nfiles, table.total):
            e = table.entry(n)
            if not table.is_dir(n):  # a link's own record: its file's key
                links[table.key(n)] = _info_of(e)
                continue
            children, parent_ino = None, 0
            if e[13] & protocol.INDEX_FLAG_LISTED:
                first, count = e[18], e[17]
                children = IndexListing(table, n, first + 2, first + count)
                parent_ino = protocol.INDEX_CHILD.unpack_from(data, _child_at(data, first + 1))[0]
            dirs[table.key(n)] = DirInfo(_info_of(e), children, parent_ino)
        return cls(tuple(roots), table, dirs, links, index_file)

    def __reduce__(self):  # sent to other nodes without this node's file (each publishes its own)
        return (Snapshot, (self.roots, self.files, self.dirs, self.links))

    @property
    def total_bytes(self) -> int:
        if isinstance(self.files, (FileTable, IndexTable)):
            return self.files.total_size()
        return sum(f.size for f in self.files.values())

    def source_path(self, key: str) -> str:
        index, _, rel = key.partition("/")
        return os.path.join(self.roots[int(index)], rel)

    def get(self, key: str) -> FileInfo | None:
        return self.files.get(key)

    def describe_with(self, routes: tuple) -> None:
        """The routes a file described from now on publishes (its node's: the stager's)."""
        if isinstance(self.files, IndexTable) and self.files.describer is not None:
            self.files.describer.use_routes(routes)

    def rebind(self, data) -> None:
        """Read the index from ``data`` from now on: the same bytes, mapped shared from the file the
        shim maps (so that a file described later is seen there, and the node holds one copy)."""
        if not isinstance(self.files, IndexTable) or not same_index(data, self.files.data):
            raise ValueError("not this snapshot's index")
        self.files.rebind(data)  # the directories' listings read it through the table

    def map_index_file(self, path: str) -> None:
        """Read the index from the file just written at ``path`` (its very bytes), mapped shared: a
        file described later (a listing-mode walk's) is described there, where the shim and the door
        read it, and the node holds the index once, not a copy beside the file's pages."""
        if not isinstance(self.files, IndexTable):
            return
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.rebind(mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        finally:
            os.close(fd)

    def publish_index(self, path: str, parts: list) -> None:
        """The index ``parts`` (``index_parts``'s) published at ``path`` for the shim and the door,
        and read from there from now on: the file it was built in renamed (the same pages), else
        written and mapped."""
        if self.index_file is not None and self.index_file.path and len(parts) == 1 and parts[0] is self.files.data:
            self.index_file.publish(path)
            return
        write_index_file(path, parts)
        self.map_index_file(path)

    def discard_index_file(self) -> None:
        """The unpublished file this snapshot's index was built in, removed (a snapshot not used)."""
        if self.index_file is not None:
            self.index_file.discard()

    def index_bytes(self, routes: tuple | None = None) -> bytes:
        return index_writer.index_bytes(self, routes)

    def index_parts(self, routes: tuple | None = None) -> list:
        """The index the shim maps (protocol.py, "Snapshot index") as the buffers that make it
        (``write_file_atomically`` writes them in turn); ``routes``: each file's route published
        (``index_writer``: per root, ``routes.size_steps`` of the node)."""
        return index_writer.index_parts(self, routes)

    def write_index(self, path: str) -> None:
        """The index written atomically at ``path`` (scripts/shim/bench_shim.py maps one)."""
        write_index_file(path, self.index_parts())

    def with_local_devices(self) -> "Snapshot":
        """The snapshot with each root's st_dev as this node sees it (a snapshot received from
        another node carries that node's device numbers, which need not be ours)."""
        remap = self._device_remap()
        if not remap:
            return self
        if isinstance(self.files, IndexTable):
            snap = Snapshot.from_index(self.roots, bytearray(self.files.data), self.files.nfiles)
            snap.localize_devices()
            return snap
        fix = lambda i: i._replace(dev=remap.get(i.dev, i.dev))  # noqa: E731
        return Snapshot(self.roots, FileTable((k, fix(i)) for k, i in self.files.items()),
                        {k: d._replace(info=fix(d.info)) for k, d in self.dirs.items()},
                        {k: fix(i) for k, i in self.links.items()})

    def localize_devices(self) -> None:
        """``with_local_devices`` in place: a stager copying from this snapshot keeps it."""
        remap = self._device_remap()
        if not remap:
            return
        fix = lambda i: i._replace(dev=remap.get(i.dev, i.dev))  # noqa: E731
        if isinstance(self.files, IndexTable):  # every entry of the index, files, directories and links alike
            self.files.remap_devices(remap)
            tables = (self.links,)
        else:
            tables = (self.files, self.links)
        for table in tables:
            for k, i in list(table.items()):
                table[k] = fix(i)
        for k, d in list(self.dirs.items()):
            self.dirs[k] = d._replace(info=fix(d.info))

    def _device_remap(self) -> dict[int, int]:
        """Node 0's device number of each root -> this node's."""
        remap = {}
        for k, root in enumerate(self.roots):
            d = self.dirs.get(f"{k}/")
            try:
                here = os.stat(root).st_dev
            except OSError:
                continue
            if d is not None and d.info.dev != here:
                remap[d.info.dev] = here
        return remap


def _child_key(dkey: str, name: str) -> str:
    return dkey + name if dkey.endswith("/") else f"{dkey}/{name}"


WALK_THREADS = 8       # directories listed and entries stat'ed at once: hides the PFS's metadata latency
WALK_CHUNK = 128       # entries of one directory stat'ed per task (a large flat directory is split)
WALK_OPEN_DIRS = 64    # directories open at once (each holds a descriptor until its entries are stat'ed)


def _describe(entries, dkey: str, rel: str, dir_ino: int):
    """Stat a slice of one directory's entries (one stat per entry, relative to the
    directory's descriptor: scandir's d_type and its cached lstat): the files, links and
    subdirectories found, each entry's listing record, and whether any entry failed (then
    the directory's listing is not known whole)."""
    files, links, subdirs, children, failed = [], [], [], [], False
    for entry in entries:
        key = _child_key(dkey, entry.name)
        try:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((f"{rel}/{entry.name}" if rel else entry.name, key,
                                entry.stat(follow_symlinks=False), dir_ino))
                d_type = protocol.DT_DIR
            elif entry.is_file():
                link = entry.is_symlink()
                files.append((key, entry.stat(), link))  # the table takes the stat's fields (FileTable.add_stat)
                if link:
                    links.append((key, FileInfo.from_stat(entry.stat(follow_symlinks=False))))
                d_type = protocol.DT_LNK if link else protocol.DT_REG
            else:  # a symlink to a directory, a broken link, a special file: named, not described
                d_type = (protocol.DT_LNK if entry.is_symlink()
                          else protocol.d_type_of(entry.stat(follow_symlinks=False).st_mode))
            children.append((os.fsencode(entry.name), d_type, entry.inode()))
        except OSError:
            failed = True  # an entry that vanished or failed: the listing is not known whole
    return files, links, subdirs, children, failed


def _list(root_fd: int, rel: str, ino: int):
    """Open directory ``rel`` of a root (relative to the root's descriptor: one lookup per
    component below the root) and list it: ``(fd, entries)``, the caller closes ``fd``;
    None if it cannot be listed or is no longer the directory its parent's entry described."""
    try:
        fd = (os.dup(root_fd) if not rel else
              os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd))
    except OSError:
        return None
    try:
        if opened_stat(fd).st_ino == ino:
            with os.scandir(fd) as it:
                return fd, list(it)
    except OSError:
        pass
    os.close(fd)
    return None


def take_snapshot(roots: tuple[str, ...], threads: int = WALK_THREADS, into: Snapshot | None = None,
                  on_directory: Callable[[list[str]], None] | None = None) -> Snapshot:
    """Walk every root once (os.scandir: one stat per file and directory, relative to the
    directory's descriptor: no lookups of the path above it).

    Directories are not followed through symlinks (their files are not the root's); a
    symlink to a file is the file the kernel would open. Every directory's listing is kept
    (names, d_type, d_ino), so the shim can list it and say that a name is absent.

    With ``threads`` > 1, directories are listed and their entries stat'ed by a few threads
    at once (a large directory in slices of WALK_CHUNK, at most WALK_OPEN_DIRS directories
    open): on a PFS each stat is a metadata round trip, and several in flight hide its
    latency. The snapshot is the same as one thread's walk: each directory's listing is
    sorted, and a directory whose listing or any entry failed is kept unlisted.

    ``into``: an empty snapshot of ``roots`` whose dictionaries the walk fills (and returns),
    so that a stager over it may copy files before the walk ends; ``on_directory(keys)`` is
    called with the files of each directory once the directory is described whole (its
    entry in ``dirs`` made), on the walking thread.
    """
    files = into.files if into is not None else FileTable()
    dirs: dict[str, DirInfo] = into.dirs if into is not None else {}
    links: dict[str, FileInfo] = into.links if into is not None else {}
    root_fds: dict[int, int] = {}
    pending = collections.deque()  # (root index, path under the root, key, its stat, its parent's ino)
    for index, root in enumerate(roots):
        try:
            root_fds[index] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            rst = os.fstat(root_fds[index])
        except OSError:
            if index in root_fds:
                os.close(root_fds.pop(index))
            continue
        try:
            parent_ino = os.stat(os.path.dirname(root.rstrip("/")) or "/").st_ino
        except OSError:
            parent_ino = 0
        pending.append((index, "", f"{index}/", rst, parent_ino))

    # per directory being described: [its stat, its parent's ino, slices left, children, failed, fd, file keys]
    state: dict[str, list] = {}

    def listed(d, got) -> list:
        """A directory's listing came back: the slices of entries to stat (none if it failed)."""
        index, rel, dkey, dst, pino = d
        if got is None:
            dirs[dkey] = DirInfo(FileInfo.from_stat(dst), None, pino)  # unreadable: its names stay the PFS's
            return []
        fd, entries = got
        slices = [entries[i:i + WALK_CHUNK] for i in range(0, len(entries), WALK_CHUNK)] or [[]]
        state[dkey] = [dst, pino, len(slices), [], False, fd, []]
        return [(part, dkey, rel, dst.st_ino) for part in slices]

    def add(result, dkey: str) -> None:
        """Merge one slice's result; the subdirectories it found are listed next."""
        got_files, got_links, subdirs, children, failed = result
        links.update(got_links)
        add = files.add_stat if isinstance(files, FileTable) else (
            lambda key, st, link: files.__setitem__(key, FileInfo.from_stat(st, link)))
        for key, st, link in got_files:
            add(key, st, link)
        st = state[dkey]
        st[2] -= 1
        st[3].extend(children)
        st[4] = st[4] or failed
        st[6].extend(key for key, *_ in got_files)
        if st[2] == 0:
            del state[dkey]
            os.close(st[5])
            dirs[dkey] = DirInfo(FileInfo.from_stat(st[0]), None if st[4] else Listing(sorted(st[3])), st[1])
            if on_directory is not None and st[6]:
                on_directory(st[6])
        index = int(dkey.partition("/")[0])
        pending.extend((index, rel, key, sst, pino) for rel, key, sst, pino in subdirs)

    try:
        if threads <= 1:
            while pending:
                d = pending.pop()
                for part, dkey, rel, ino in listed(d, _list(root_fds[d[0]], d[1], d[3].st_ino)):
                    add(_describe(part, dkey, rel, ino), dkey)
            return Snapshot(roots=tuple(roots), files=files, dirs=dirs, links=links)

        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
        with ThreadPoolExecutor(threads, thread_name_prefix="monarch-walk") as pool:
            running = {}
            while pending or running:
                while pending and len(state) + sum(w == "list" for w, _ in running.values()) < WALK_OPEN_DIRS:
                    d = pending.popleft()
                    running[pool.submit(_list, root_fds[d[0]], d[1], d[3].st_ino)] = ("list", d)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    what, d = running.pop(future)
                    if what == "list":
                        for part, dkey, rel, ino in listed(d, future.result()):
                            running[pool.submit(_describe, part, dkey, rel, ino)] = ("describe", dkey)
                    else:
                        add(future.result(), d)
        return Snapshot(roots=tuple(roots), files=files, dirs=dirs, links=links)
    finally:
        for fd in root_fds.values():
            os.close(fd)
        for st in state.values():  # only after an error: every directory is closed when described
            os.close(st[5])


# -- reuse across jobs -------------------------------------------------------------------
def _info_of(fields: tuple, link: bool = False) -> FileInfo:
    (size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, _flags, _link, blocks, blksize) = fields[3:17]
    return FileInfo(size, mtime, mode, atime, ctime, ino, dev, uid, gid, nlink, link, blocks, blksize)


def _child_at(data, i: int) -> int:
    return protocol.INDEX_HEADER.unpack_from(data)[9] + protocol.INDEX_CHILD.size * i


def read_index(data: bytes | bytearray, roots: tuple[str, ...]) -> Snapshot:
    """The snapshot an index file was written from (``Snapshot.write_index``'s inverse), read in
    place (``Snapshot.from_index``)."""
    return Snapshot.from_index(roots, data if isinstance(data, bytearray) else bytearray(data), files_in(data))


def write_index_file(path: str, parts: list) -> None:
    """The index ``parts`` (``Snapshot.index_parts``'s) written at ``path`` up to their used end, the
    file as long as the index says (the room for stats written later: a sparse tail)."""
    head = bytes(parts[0][:protocol.INDEX_HEADER.size])
    written, done = [], 0
    for start, end in used_ranges(protocol.INDEX_HEADER.unpack(head)):  # the rooms' unused parts left holes
        if start > done:
            written.append(start - done)
        at = 0
        for part in parts:
            view = memoryview(part)
            lo, hi = max(start, at), min(end, at + len(view))
            if lo < hi:
                written.append(view[lo - at:hi - at])
            at += len(view)
        done = end
    write_file_atomically(path, written, size=index_size(head))


def same_index(a, b) -> bool:
    """Do ``a`` and ``b`` hold the same index (their headers equal but for the stats used)?"""
    ha, hb = protocol.INDEX_HEADER.unpack_from(a), protocol.INDEX_HEADER.unpack_from(b)
    return ha[:12] == hb[:12] and ha[13:] == hb[13:]


CHECKERS = 8  # directories stat'ed at once when a kept snapshot or a manifest is checked (the PFS's metadata servers)


def read_index_file(path: str, roots: tuple[str, ...], index_at: str | None = None) -> Snapshot:
    """The snapshot in an index file (a kept snapshot, a manifest); ``index_at``: read from a copy
    of it beside that path (``IndexFile.copy_of``: the kernel copies, the daemon reads nothing),
    published there by ``Snapshot.publish_index``."""
    if index_at:
        made = IndexFile.copy_of(path, index_at)
        try:
            check_tables(made.data)
            nfiles = files_in(made.data)
            if nfiles is not None:
                return Snapshot.from_index(roots, made.data, nfiles, made)
        except BaseException:
            made.discard()
            raise
        made.discard()  # an index of no directory: read entry by entry, below
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        if f.readinto(data) != len(data):
            raise ValueError(f"{path} changed while it was read")
    check_tables(data)
    return read_index(data, roots)


def unchanged(snap: Snapshot, checkers: int = CHECKERS, whole: bool = True) -> bool:
    """Does every directory of the snapshot still have the inode, mtime and ctime it had (and,
    ``whole``, was every one listed whole: a kept snapshot's unlisted directory is listed again by
    the next walk; a manifest's, a list's, is the PFS's)? One stat per directory, relative to its
    root's descriptor, ``checkers`` at once (at a PFS's latency a million directories one by one
    take minutes)."""
    if not snap.dirs or not all(f"{k}/" in snap.dirs for k in range(len(snap.roots))):
        return False
    if whole and any(d.children is None for d in snap.dirs.values()):
        return False
    dirs = list(snap.dirs.items())
    where = [(int(k), rel) for k, _, rel in (key.partition("/") for key, _ in dirs)]
    return all(st is not None and (st.st_ino, st.st_mtime_ns, st.st_ctime_ns) == (d.info.ino, d.info.mtime_ns,
                                                                                 d.info.ctime_ns)
               for st, (_, d) in zip(lstats_under_roots(snap.roots, where, checkers), dirs))


MANIFEST_UNCHECKED = "manifest, checked after the start"


def load_or_walk(roots: tuple[str, ...], cache: str | None, fresh: bool = False, into: Snapshot | None = None,
                 on_directory: Callable[[list[str]], None] | None = None,
                 manifest: str = "", describe: bool = True, check_later: bool = False,
                 index_at: str | None = None) -> tuple[Snapshot, str]:
    """The snapshot of ``roots``: the kept one at ``cache`` if nothing changed (see the module
    doc), else the ``manifest`` (``monarch index``'s file) if nothing changed since it was made,
    else a fresh walk, kept at ``cache`` for the next job. Returns it and how it was obtained
    (``"reused"``, ``"manifest"``, ``"walked"``, or ``"walked: <why not reused>"``). ``into``
    and ``on_directory`` are take_snapshot's, for a walk (a reused snapshot is returned whole).
    ``describe`` False: the C walk in listing mode (walker.c): the files named, not stat'ed, each
    described when first needed (``IndexTable.get``) or by ``describe_rest``. ``check_later``: a
    manifest a listing-mode walk wrote is returned unchecked (``MANIFEST_UNCHECKED``: no stat before
    the job starts; its caller checks it with ``unchanged`` and serves no metadata from it before):
    every file of it is described at its open, so no byte or stat served can be older than that.
    ``index_at``: where the index will be published; the C walk's index, a kept one or a manifest
    is built in a file beside it (``Snapshot.index_file``), for ``Snapshot.publish_index``."""
    why = "fresh walk asked" if fresh else "no kept snapshot"
    for path, how in ((cache, "reused"), (manifest, "manifest")):
        if not path or fresh:
            continue
        snap = None
        try:
            snap = read_index_file(path, roots, index_at)
            if how == "manifest" and check_later and listing_index(snap):
                return snap, MANIFEST_UNCHECKED
            if unchanged(snap, whole=how == "reused"):
                return snap, how
            snap.discard_index_file()
            why = ("a directory changed since the kept snapshot" if how == "reused" else
                   f"a directory changed since the manifest {path} was made: run `monarch index` again")
        except FileNotFoundError:
            if how == "manifest":
                why = f"the manifest {path} is gone"
        except (OSError, ValueError, IndexError, Exception) as e:  # a damaged or foreign file: walk
            if snap is not None:
                snap.discard_index_file()
            damage = f"{type(e).__name__}: {e}" if isinstance(e, ValueError) and str(e) else type(e).__name__
            why = (f"kept snapshot unreadable ({damage})" if how == "reused" else
                   f"the manifest {path} is not one `monarch index` wrote ({damage}): run `monarch index` again")
    if manifest and not fresh:
        log.warning("the dataset is walked: %s", why)
    made: list[IndexFile] = []

    def in_file(size: int):  # the C walk's index built in the file the shim will map
        made.append(IndexFile.blank(index_at, size))
        return made[-1].data
    try:
        walked = walker.walk_index(tuple(roots), describe=describe, buffer=in_file if index_at else None)
    except BaseException:
        for f in made:
            f.discard()
        raise
    if walked is not None:  # the C walk: its index is the snapshot (the copies begin once it is whole)
        snap = Snapshot.from_index(roots, *walked, made[-1] if made else None)
    else:
        snap = take_snapshot(roots, into=into, on_directory=on_directory)
    if cache:
        try:
            write_index_file(cache, snap.index_parts())
        except OSError as e:
            log.warning("cannot keep the snapshot at %s for the next job: %s", cache, e.strerror)
    return snap, f"walked: {why}"


def write_manifest(roots: tuple[str, ...], out: str, describe: bool = False) -> Snapshot:
    """``monarch index``: the roots walked once (the C walk, in parallel; listing mode unless
    ``describe``) and written to ``out`` as a kept snapshot is, for ``dataset.manifest``
    (load_or_walk checks it by its directories)."""
    walked = walker.walk_index(tuple(roots), describe=describe)
    snap = Snapshot.from_index(roots, *walked) if walked is not None else take_snapshot(tuple(roots))
    write_index_file(out, snap.index_parts())
    return snap


def listing_index(snap: Snapshot) -> bool:
    """Did a listing-mode walk make the snapshot's index, every file of it undescribed?"""
    return isinstance(snap.files, IndexTable) and bool(
        protocol.INDEX_HEADER.unpack_from(snap.files.data)[4] & protocol.INDEX_LISTING)


def describe_rest(snap: Snapshot, routes: tuple | None) -> int:
    """Every file a listing-mode walk left undescribed, stat'ed now (a few threads; index_fill.c's
    walk_describe, or one by one here without it), its route published with ``routes``. The
    number described (a file gone or no longer regular stays undescribed)."""
    table = snap.files
    if not isinstance(table, IndexTable) or not table.undescribed():
        return 0
    if routes is not None and len(routes) == len(snap.roots) and not isinstance(table.data, bytes):
        got = walker.describe_index(table.data, table.nfiles, snap.roots, index_writer.route_tables(routes))
        if got is not None:
            return got
    before = table.undescribed()
    for n in range(table.nfiles):  # without the C library: one by one (Describer)
        table.described(n)
    return before - table.undescribed()

"""Dataset roots mounted from a key-value store: their snapshot from the store's manifest, and
the source the stager copies their files from.

A root listed in ``dataset.stores`` has no directory on disk: the snapshot describes it from
the manifest (``monarch/store/manifest.py``), the shim answers ``stat``, ``access`` and
listings under it from the index as for any root, and opens from the tiers; a file not
staged yet is staged on demand, first, by the daemon, and an open the daemon cannot serve
fails with EIO (the shim knows the store's roots: ``MONARCH_STORE_ROOTS``), never falls
through to a path that does not exist.

Correct bytes: a value is staged only if its length and digest are the manifest's; else it
is refused (named in the report) and its opens fail with EIO. A store that stops answering
makes each copy wait at most its URL's ``timeout``, then fail; once it has been down that
long, copies fail at once (one try a second), so the opens of unstaged files fail after a
bounded wait while staged ones go on.

The daemon holds one ``StoreSet`` (``NodeDaemon.stores``) and calls it at a few hooks: the
snapshot (``load_snapshot``), every stager it makes (``attach``: the PFS source wrapped in a
``RoutedSource``, deep at the start for a high-latency store), its statistics (``stats``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from monarch.config import Config
from monarch.node.stage.concurrency import Concurrency
from monarch.node.snapshot.snapshot import Snapshot, take_snapshot
from monarch.node.stage.read_ahead_modes import Where, decide
from monarch.node.stage.sources import Source, SourceChanged
from monarch.records.filetable import FileTable
from monarch.store import client as store_client
from monarch.store.load import fetch_manifest
from monarch.store import keys as store_keys
from monarch.store.manifest import add_to_snapshot, digest
from monarch.store.s3 import Pieces, S3URL
from monarch.store.url import StoreError, StoreURL

log = logging.getLogger(__name__)

START_DEPTH = 64  # copies in flight from the start toward a store (each a request; the stager adapts from there)
PREFETCH_BYTES = 64 << 20   # read-ahead: values fetched ahead of the stager, at most (in flight or waiting)
PREFETCH_BATCH = 32         # GETs per pipeline (one round trip)
PREFETCH_BATCH_BYTES = 4 << 20
PREFETCH_START = 8          # pipelines in flight at first; then as many as the store's latency wants
PREFETCH_MAX = 64           # (concurrency.Concurrency: the front door's rule), up to this
RETRY_DOWN = 1.0  # seconds between tries of a store found down for longer than its timeout
NAMED = 50        # refused files named in the report at most (all are counted)


class StoreMismatch(SourceChanged):
    """The store's value is not the one its manifest describes (size, digest) or is missing."""


class StoreLost(OSError):
    """The store did not answer within its bounded wait."""


class Mount:
    """One root served from a store: its URL, its client, its files' digests."""

    def __init__(self, k: int, path: str, url: StoreURL | S3URL):
        self.k, self.path, self.url = k, path, url
        self.client = None
        self.digests: dict[str, str] = {}  # rel -> the manifest's digest
        self.version = ""
        self.skipped: tuple[tuple[str, str], ...] = ()  # keys not served as files (key, why)
        self.down_since: float | None = None
        self.last_try = 0.0
        self.prefetch: Prefetch | None = None
        self.lock = threading.RLock()

    def connect(self) -> None:
        if self.client is None:
            with self.lock:
                if self.client is None:
                    self.client = store_client.ping(self.url)


class Prefetch:
    """Out-of-order, pipelined read-ahead of one store's values, in the stager's read-ahead order.

    Pipelines of up to PREFETCH_BATCH GETs each are in flight at once, as many as the store's
    measured latency wants (``Concurrency``, the rule of every lane of whole files: from PREFETCH_START, up while
    a pipeline's round trip stays flat, to PREFETCH_MAX), at most PREFETCH_BYTES of values
    fetched and not yet taken; each pipeline's values are
    handed to the stager's copies as soon as it returns, whatever the order, and a slow
    pipeline holds up none of the others. Each value is read once: a copy of a key the
    read-ahead has not asked for yet (a demanded file) claims it and GETs it itself; one
    already asked for waits for that answer. A failed pipeline stops the read-ahead here:
    its keys and the rest are fetched by the copies themselves (with the bounded wait).
    Values fetched and never taken (the tiers filled up) are counted as read."""

    INFLIGHT, READY, TAKEN = 1, 2, 3

    def __init__(self, mount: Mount, order: list[tuple[str, int]]):
        self.mount, self.order = mount, order  # (rel, size) in read-ahead order
        self.cv = threading.Condition()
        self.state: dict[str, int] = {}
        self.ready: dict[str, bytes | None] = {}
        self.pos = 0
        self.outstanding = 0  # bytes asked for or waiting, not yet taken
        self.closed = False
        self.fetched_bytes = 0
        self.flow = Concurrency(start=PREFETCH_START, low=1, high=PREFETCH_MAX)
        self.pipelines = 0  # in flight now
        self.threads: list[threading.Thread] = []
        with self.cv:
            self._staff_locked()

    def _staff_locked(self) -> None:
        """As many pipeline threads as the measure allows (each keeps one pipeline in flight)."""
        while len(self.threads) < self.flow.limit and not self.closed:
            t = threading.Thread(target=self._run, name=f"monarch-store-prefetch-{len(self.threads)}", daemon=True)
            self.threads.append(t)
            t.start()

    def _batch(self) -> list[tuple[str, int]] | None:
        with self.cv:
            while True:
                if self.closed or self.pos >= len(self.order):
                    self.flow.starved()
                    return None
                if self.outstanding < PREFETCH_BYTES and self.pipelines < self.flow.limit:
                    break
                if self.outstanding >= PREFETCH_BYTES:
                    self.flow.starved()  # waiting for the stager to take values: says nothing of the store
                self.cv.wait()
            batch, nbytes = [], 0
            while (self.pos < len(self.order) and len(batch) < PREFETCH_BATCH and nbytes < PREFETCH_BATCH_BYTES
                   and self.outstanding < PREFETCH_BYTES):
                rel, size = self.order[self.pos]
                self.pos += 1
                if rel in self.state:
                    continue  # claimed by a copy already
                self.state[rel] = self.INFLIGHT
                self.outstanding += size
                nbytes += size
                batch.append((rel, size))
            if batch:
                self.pipelines += 1
            return batch

    def _run(self) -> None:
        while (batch := self._batch()) is not None:
            if not batch:
                continue
            t0 = time.monotonic()
            try:
                pipe = self.mount.client.pipeline(transaction=False)
                for rel, _ in batch:
                    pipe.get(self.mount.url.key(rel))
                values = pipe.execute()
            except Exception as e:  # the copies fetch these (and the rest) themselves
                log.warning("store: the read-ahead from %s stopped: %s", self.mount.url,
                            store_client.explain(self.mount.url, e))
                with self.cv:
                    self.closed = True
                    self.pipelines -= 1
                    for rel, size in batch:
                        del self.state[rel]
                        self.outstanding -= size
                    self.cv.notify_all()
                return
            with self.cv:
                self.pipelines -= 1
                self.flow.completed(time.monotonic() - t0)
                self._staff_locked()
                for (rel, _), value in zip(batch, values):
                    self.state[rel] = self.READY
                    self.ready[rel] = value
                    self.fetched_bytes += len(value) if value is not None else 0
                self.cv.notify_all()

    def take(self, rel: str, size: int) -> tuple[bool, bytes | None]:
        """(True, value) if the read-ahead has it (waiting for it if asked for already);
        else (False, None), the key claimed: the caller GETs it."""
        with self.cv:
            while self.state.get(rel) == self.INFLIGHT:
                self.cv.wait()
            if self.state.get(rel) == self.READY:
                self.state[rel] = self.TAKEN
                self.outstanding -= size
                self.cv.notify_all()
                return True, self.ready.pop(rel)
            self.state[rel] = self.TAKEN
            return False, None

    def unused_bytes(self) -> int:
        with self.cv:
            return sum(len(v) for v in self.ready.values() if v is not None)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.ready.clear()
            self.cv.notify_all()


class StoreSet:
    """Every store-backed root of the daemon's dataset, and what happened to their values."""

    def __init__(self, config: Config, cluster: bool = False):
        roots = config.dataset.roots
        where = Where.WALKING if cluster else Where.ALONE  # a cluster's layout is not decided yet
        self.read_ahead = decide(config.staging.policy, where, stores=True).store_ahead
        self.mounts: dict[int, Mount] = {k: Mount(k, roots[k], store_client.parse_url(url))
                                         for k, url in config.dataset.store_urls().items()}
        self._lock = threading.Lock()
        self.refused: dict[str, str] = {}  # path under the mount -> why (size, digest, missing)
        self.refused_count = 0
        self.lost_copies = 0  # copies that failed because the store did not answer
        self.lost_at: float | None = None

    @classmethod
    def of(cls, config: Config, cluster: bool = False) -> "StoreSet | None":
        """The daemon's stores (None: no root is a store). In a cluster each node reads from the
        store only the keys it owns (the stager's schedule): no read-ahead here, which would
        read every key."""
        if not config.dataset.stores:
            return None
        return cls(config, cluster)

    # -- the snapshot ------------------------------------------------------------------------
    def load_snapshot(self, roots: tuple[str, ...], into: Snapshot | None = None,
                      on_directory: Callable[[list[str]], None] | None = None) -> tuple[Snapshot, str]:
        """The snapshot of every root: a store's from its manifest (one GET), the others walked."""
        others = tuple("" if k in self.mounts else root for k, root in enumerate(roots))
        if any(others):
            snap = take_snapshot(others, into=into, on_directory=on_directory)
            files, dirs, links = snap.files, snap.dirs, snap.links
        else:
            files = into.files if into is not None else FileTable()
            dirs = into.dirs if into is not None else {}
            links = into.links if into is not None else {}
        described = []
        for k, mount in self.mounts.items():
            mount.connect()
            manifest = fetch_manifest(mount.client, mount.url)
            mount.digests = {e.path: e.digest for e in manifest.files}
            mount.version = manifest.version
            mount.skipped = manifest.skipped
            if manifest.skipped:
                log.warning("store: %s: %s", mount.url, store_keys.summary(manifest.skipped))
            keys = add_to_snapshot(k, manifest, roots[k], files, dirs)
            if self.read_ahead and keys:  # in the stager's read-ahead order (sorted keys)
                mount.prefetch = Prefetch(mount, sorted((e.path, e.size) for e in manifest.files))
            described.append(f"{len(keys)} files from {mount.url} (manifest {manifest.version[:12]})")
            if on_directory is not None and keys:
                on_directory(keys)
        return Snapshot(tuple(roots), files, dirs, links), "manifest: " + "; ".join(described)

    # -- the stager's side -----------------------------------------------------------------
    def stager_options(self) -> dict:
        """A stager's start depth, its copies of store keys read from the store (its PFS source
        wrapped), and which roots are a store's (their files' route)."""
        return {"start_depth": START_DEPTH, "pfs_source": lambda pfs: RoutedSource(pfs, self),
                "store_roots": frozenset(self.mounts)}

    def mount_of(self, key: str) -> Mount | None:
        k, _, _ = key.partition("/")
        return self.mounts.get(int(k)) if k.isdigit() else None

    def _digests(self, mount: Mount) -> dict[str, str]:
        """The manifest's digests: read with the snapshot on the node that made it, else (a
        cluster's other nodes, which received the snapshot) once, at the first copy."""
        if not mount.digests:
            with mount.lock:
                if not mount.digests:
                    try:
                        mount.connect()
                        manifest = fetch_manifest(mount.client, mount.url)
                    except StoreError as e:
                        with self._lock:
                            self.lost_copies += 1
                        raise StoreLost(str(e)) from None
                    mount.version = manifest.version
                    mount.digests = {e.path: e.digest for e in manifest.files}
        return mount.digests

    def copy(self, mount: Mount, key: str, info, out, tally) -> int:
        rel = key.partition("/")[2]
        digests = self._digests(mount)
        found, data = mount.prefetch.take(rel, info.size) if mount.prefetch is not None else (False, None)
        if not found:
            data = self._get(mount, rel)
        tally.opened()
        if data is None:
            raise self._refuse(mount, rel, "missing from the store")
        if isinstance(data, Exception):  # a pipelined GET the store refused (S3: changed since the listing)
            raise self._refuse(mount, rel, f"the store answered {data}")
        tally.read(len(data))
        if len(data) != info.size:
            raise self._refuse(mount, rel, f"size {len(data)} in the store, {info.size} in the manifest")
        if mount.url.has_digests and digest(data) != digests.get(rel):  # S3: each GET checked by its ETag
            raise self._refuse(mount, rel, "digest differs from the manifest's")
        for piece in (data.buffers if isinstance(data, Pieces) else (data,)):  # S3: a large object's ranged GETs
            if isinstance(out, int):
                view = memoryview(piece)
                while view:
                    view = view[os.write(out, view):]
            else:
                out.write(piece)
        return len(data)

    def _refuse(self, mount: Mount, rel: str, why: str) -> StoreMismatch:
        path = os.path.join(mount.path, rel)
        log.error("store: %s not served: %s (%s)", path, why, mount.url)
        with self._lock:
            self.refused_count += 1
            if len(self.refused) < NAMED:
                self.refused[path] = why
        return StoreMismatch(f"{path}: {why}")

    def _get(self, mount: Mount, rel: str) -> bytes | None:
        """GET one value; a store that does not answer is retried until its timeout, then
        given up (and, once down that long, tried once a second only)."""
        timeout = mount.url.timeout
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            now = time.monotonic()
            with self._lock:
                down = mount.down_since
                if down is not None and now - down >= timeout and now - mount.last_try < RETRY_DOWN:
                    self.lost_copies += 1
                    raise StoreLost(f"the store at {mount.url} has not answered for {now - down:.0f} s")
                mount.last_try = now
            try:
                if mount.client is None:
                    mount.connect()
                value = mount.client.get(mount.url.key(rel))
            except Exception as e:
                if not isinstance(e, StoreError) and not store_client.is_connection_error(e):
                    # the store answered, with an error (WRONGTYPE: the key holds no string): not the value
                    raise self._refuse(mount, rel, f"the store answered {str(e).strip() or type(e).__name__}") \
                        from None
                now = time.monotonic()
                with self._lock:
                    mount.last_try = now  # a second from the end of a failed try: a hung store costs one try a second
                    if mount.down_since is None:
                        mount.down_since = now
                        self.lost_at = time.time()
                        log.error("store: %s", store_client.explain(mount.url, e))
                    if now + delay >= deadline or now - mount.down_since >= timeout:
                        self.lost_copies += 1
                        raise StoreLost(f"the store at {mount.url} did not answer within {timeout:g} s") from None
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
                continue
            if mount.down_since is not None:
                with self._lock:
                    mount.down_since = None
                log.warning("store: %s answers again", mount.url)
            return value

    # -- statistics and the end ------------------------------------------------------------
    def stats(self, stager) -> dict:
        """The store's slice of the node's staging statistics."""
        with self._lock:
            store = {"urls": {m.path: str(m.url) for m in self.mounts.values()},
                     "versions": {m.path: m.version for m in self.mounts.values()},
                     "refused": dict(self.refused), "refused_count": self.refused_count,
                     "lost_copies": self.lost_copies, "lost_at": self.lost_at,
                     "skipped": {m.path: [list(s) for s in m.skipped[:store_keys.NAMED]]
                                 for m in self.mounts.values() if m.skipped},
                     "skipped_count": {m.path: len(m.skipped) for m in self.mounts.values() if m.skipped}}
        unused = sum(m.prefetch.unused_bytes() for m in self.mounts.values() if m.prefetch is not None)
        store["read_ahead_unused_bytes"] = unused  # fetched ahead, never staged (counted as read)
        # the read-ahead's pipelines in flight: the limit its measure of the store settled on, the most
        store["read_ahead_pipelines"] = {m.path: m.prefetch.flow.state() for m in self.mounts.values()
                                         if m.prefetch is not None}
        return {"store_files_read": stager.files_read["store"], "store_bytes_read": stager.bytes_read["store"] + unused,
                "store": store}

    def close(self) -> None:
        for mount in self.mounts.values():
            if mount.prefetch is not None:
                mount.prefetch.close()
            if mount.client is not None:
                try:
                    mount.client.close()
                except Exception:
                    pass


class RoutedSource(Source):
    """The stager's first source: a store's keys from the store, every other key from the PFS."""

    name = "pfs"

    def __init__(self, pfs: Source, stores: StoreSet):
        self.pfs, self.stores = pfs, stores

    def copy(self, key: str, info, out, tally) -> int:
        mount = self.stores.mount_of(key)
        if mount is None:
            return self.pfs.copy(key, info, out, tally)
        # counted under "store", not "pfs": the stager's tally for this copy, renamed (SourceTally)
        return self.stores.copy(mount, key, info, out, type(tally)(tally.books, "store"))

    def forget(self, key: str) -> None:
        if self.stores.mount_of(key) is None:
            self.pfs.forget(key)

    def close(self) -> None:
        self.pfs.close()


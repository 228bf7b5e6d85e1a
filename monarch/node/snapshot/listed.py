"""A listing-mode snapshot in the daemon, after its index is published: the files the walk left
undescribed described in one pass where the read-ahead plans by size, a manifest served before its
check checked, and the files described during the job kept for the next one.

The walk (``walker.c``, listing mode) names the files without a stat; each is described when first
needed (the front door's miss, ``IndexTable.get``) in the index the shim maps. What is left is here,
each step run once by the daemon's preparing thread (``NodeDaemon``), none able to fail the job.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time

from monarch import protocol
from monarch.node.snapshot.indextable import IndexTable
from monarch.node.snapshot.snapshot import (MANIFEST_UNCHECKED, Snapshot, describe_rest, listing_index, unchanged,
                                            write_index_file)

log = logging.getLogger(__name__)

_LISTING_AT = 20  # INDEX_HEADER's reserved word, where INDEX_LISTING is
CHECKERS_MEANWHILE = 2  # a manifest's directories stat'ed at once while the job runs: its own calls come first
MANIFEST_CHANGED = ("manifest: a directory changed since it was made: its metadata is the PFS's for this job; "
                    "run `monarch index` again")


class ListedFiles:
    """The undescribed files of one job's snapshot (``snap``), from its index's publication on."""

    def __init__(self, snap: Snapshot, how: str, counters_path: str):
        self.snap, self.how, self._counters = snap, how, counters_path
        files = snap.files
        # a listing walk's own index says all its files are undescribed: 10 million not counted in Python
        self._at_start = (files.nfiles if listing_index(snap) else files.undescribed()) if isinstance(files, IndexTable) else 0
        self.described = threading.Event()  # the one pass ended, or there was none to make
        if how == MANIFEST_UNCHECKED:  # nothing answered from it before its check (before the index is written)
            mark_unchecked(counters_path, len(snap.roots), True)

    @property
    def listed(self) -> bool:
        """Did the walk leave files undescribed (the dataset's bytes are then those described so far)?"""
        return self._at_start > 0

    def pending(self, describe_all: bool) -> bool:
        """Is a check or a pass to make (which no request waits for)?"""
        return self.how == MANIFEST_UNCHECKED or (describe_all and self._at_start > 0)

    def check(self) -> str:
        """A manifest served unchecked: its directories' stats now (``unchanged``). All unchanged:
        its metadata is answered from the index from now on; else it stays the PFS's (its files were
        described at their opens all along). The snapshot's ``how`` from now on."""
        if self.how == MANIFEST_UNCHECKED:
            t0 = time.perf_counter()
            if unchanged(self.snap, CHECKERS_MEANWHILE, whole=False):
                mark_unchecked(self._counters, len(self.snap.roots), False)
                self.how = "manifest"
                log.info("the manifest checked in %.2fs: its metadata is answered here", time.perf_counter() - t0)
            else:
                self.how = MANIFEST_CHANGED
                log.warning("the %s", MANIFEST_CHANGED)
        return self.how

    def describe(self, routes: tuple, wanted: bool) -> None:
        """Every file still undescribed, in one pass (``wanted``: the read-ahead plans by size)."""
        try:
            if wanted and isinstance(self.snap.files, IndexTable):
                t0 = time.perf_counter()
                if got := describe_rest(self.snap, routes):
                    log.info("described %d files listed by the walk in %.2fs", got, time.perf_counter() - t0)
        finally:
            self.described.set()

    def keep(self, cache: str | None) -> None:
        """The files described during the job written with the kept snapshot (``cache``), whose
        next job then adopts its copies without a stat each."""
        files = self.snap.files
        if not cache or not isinstance(files, IndexTable) or files.undescribed() == self._at_start:
            return
        head = bytearray(files.data[:protocol.INDEX_HEADER.size])
        reserved = struct.unpack_from("<I", head, _LISTING_AT)[0] & ~protocol.INDEX_LISTING
        struct.pack_into("<I", head, _LISTING_AT, reserved)  # some of its files are described now: no longer a listing's alone
        try:
            write_index_file(cache, [head, memoryview(files.data)[len(head):]])
        except OSError as e:
            log.warning("cannot keep the snapshot at %s for the next job: %s", cache, e.strerror)


def mark_unchecked(counters_path: str, nroots: int, unchecked: bool) -> None:
    """The daemon's own word of the counters file (EXTRA_META_UNCHECKED): every root's metadata the
    PFS's while its snapshot is not checked yet (a manifest read without its directories' stats),
    or the index's again once it is. One aligned 8-byte write: the shims only read it."""
    mask = (1 << min(nroots, 64)) - 1 if unchecked else 0
    at = 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS + protocol.EXTRA_META_UNCHECKED)
    fd = os.open(counters_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.pwrite(fd, mask.to_bytes(8, "little"), at)
    finally:
        os.close(fd)

"""The front door's book-keeping beside a stager: told of the stager's copies, and the door's copies booked in the stager's.

The C front door (``monarch.frontdoor``) answers OPENs of staged files from a table of its
own and copies small files itself while the PFS is fast. A ``DoorLink`` subscribes to one
stager's events (``StagerListener``) and keeps the two sets of books one: the door is told
of every copy published or dropped, every key is claimed before the stager copies it (a
file is never copied twice), the door's copies enter the stager's books (``absorb``), and
the room the door copies into is lent out of the first tier, a chunk at a time, and given
back whenever the stager wants it. Neither the stager nor the door knows the other.
"""

from __future__ import annotations

import logging

from monarch.frontdoor import EV_SLOW, EV_STAGED, FrontDoor
from monarch.node.stager import INLINE_BYTES, Stager
from monarch.node.stager_books import StagerListener
from monarch.node.tiers import Tier

log = logging.getLogger(__name__)

__all__ = ["DoorLink"]

LEASE_MAX = 16 << 20  # tier room lent to the front door at a time, at most ...
LEASE_SHARE = 32      # ... and at most this share of the tier's capacity


class DoorLink(StagerListener):
    """``door`` kept told of ``stager``'s copies. With ``may_copy`` the door copies small files
    itself while the PFS is fast, into the first tier, within room lent to it (only when
    that tier is raw, the node not in a cluster, and it is the tier the door copies to)."""

    def __init__(self, door: FrontDoor, stager: Stager, may_copy: bool):
        self.door = door
        self.stager = stager
        tiers = stager.tiers
        self.may_copy = (may_copy and stager.peers is None and bool(tiers)
                         and tiers[0].codec is None and door.copy_slot == tiers[0].slot)
        with stager.lock:  # the books so far, then every event: nothing is missed in between
            stager.subscribe_locked(self)
            for key in stager.flights:  # copies under way are the stager's
                door.claim(key)
            if stager.dirty:
                door.disable()
            self._tend_locked()

    # -- the stager's events (StagerListener) ------------------------------------------------
    def published(self, key: str, tier: Tier) -> None:
        if tier.is_compressed(key):
            self.door.forget(key)  # a compressed copy is answered by Python (decoded or a memfd)
        else:
            self.door.staged(key, tier.slot)

    def dropped(self, key: str) -> None:
        self.door.forget(key)

    def written(self, key: str) -> None:
        self.door.disable()  # no copy of the door's after this one; those made are dropped by the stager
        self.absorb()

    def claiming(self, key: str) -> bool:
        if not self.door.claim(key):
            return False
        self.absorb()  # the door copied it first
        return True

    def room_wanted(self, tier: Tier) -> bool:
        return self.may_copy and tier is self.stager.tiers[0] and self.reclaim_lease()

    # -- the door's copies -------------------------------------------------------------------
    def absorb(self) -> int:
        """Enter what the door copied into the stager's books, lend it room. Returns how
        many files it staged."""
        books = self.stager
        staged = 0
        with books.lock:  # drained under the lock: a claim that finds a copy of the door's finds it here
            for ev in self.door.events():
                if ev.kind == EV_SLOW:
                    log.info("the PFS is slow for the front door (a copy's read took %.1f ms): its misses go "
                             "to the staging threads for a while", ev.seconds * 1e3)
                    continue
                books.count_read_locked("pfs", int(ev.kind == EV_STAGED or ev.bytes_read > 0), ev.bytes_read)
                if ev.kind == EV_STAGED:
                    tier = next(t for t in books.tiers if t.slot == ev.slot)
                    books.enter_copy_locked(ev.key, tier, ev.size)
                    staged += 1
            self._tend_locked()
        return staged

    def _tend_locked(self) -> None:
        books = self.stager
        allowed = (self.may_copy and not books.dirty and not books.closed
                   and books.tiers[0].full_reason is None)  # a full filesystem: the stager finds out
        self.door.copying(allowed)  # whether the PFS is fast enough for it, the door finds out itself
        if not allowed:
            self.reclaim_lease()
        else:
            tier = books.tiers[0]
            chunk = max(INLINE_BYTES, min(LEASE_MAX, tier.capacity // LEASE_SHARE))
            if self.door.lease() < chunk // 2 and tier.reserve(chunk, counted=False):
                self.door.grant(chunk)

    def reclaim_lease(self) -> bool:
        """Give the door's unused room back to its tier: for a true report, and whenever
        the stager finds no room (the next ``absorb`` lends again what is free). True if
        there was some."""
        if not self.may_copy:
            return False
        left = self.door.reclaim()
        if left:
            self.stager.tiers[0].release(left)
        return left > 0

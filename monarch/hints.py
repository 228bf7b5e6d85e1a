"""Order hints (optional): tell the node daemon the order the coming epoch will read.

Monarch is transparent without them. With them the daemon stages just ahead of the
reader and, when the dataset is larger than the tiers, drops copies this epoch has
consumed to make room for ones it has not (clairvoyant, as NoPFS: a file is read from the
PFS at most once per epoch, and what stays from the last epoch is served from the tiers).

With a PyTorch-like sampler (nothing here imports torch)::

    from monarch.hints import HintedSampler
    sampler = HintedSampler(RandomSampler(ds), path_of=lambda i: ds.paths[i])
    loader = DataLoader(ds, sampler=sampler, num_workers=8)

or, one shard per rank as PyTorch's ``DistributedSampler`` gives it (each node's daemon also
fetches the other nodes' files of its shard ahead of the reader, in batches, into its peer area,
unless ``peer.fetch_ahead: false``; see docs/cluster.md, "The readers' order")::

    from monarch.hints import DistributedHintedSampler
    sampler = DistributedHintedSampler(ds, num_replicas=world, rank=rank, path_of=lambda i: ds.paths[i])
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for i in sampler: ...

or by hand::

    from monarch.hints import Hints
    with Hints() as h:
        h.order(paths)        # the coming epoch's order (paths under a dataset root)
        ...
        h.progress(n)         # the reader is done with the first n of them

Outside ``monarch run`` (no MONARCH_SOCKET) or when the daemon does not answer, every call
does nothing: hints never fail a job (fail open). ``MONARCH_DISABLE=1`` turns off the shim,
not the hints: a reader that opens through another path (support.pyshim) still
steers the daemon.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
from typing import Any, Callable, Iterable, Iterator, Mapping

from monarch import protocol, secure

log = logging.getLogger(__name__)

TIMEOUT = 5.0  # seconds for the daemon to acknowledge one hint frame


UNANSWERED_MAX = 64  # progress frames sent before their answers are read


class _Refused(Exception):
    """The daemon answered a hint frame with an error."""


class Hints:
    """One reader's hint stream to its node's daemon (one per process that samples)."""

    def __init__(self, env: Mapping[str, str] | None = None, stream: int | None = None):
        env = os.environ if env is None else env
        self.stream = stream if stream is not None else secrets.randbits(63)
        self._socket_path = env.get(protocol.ENV_SOCKET, "")
        self._roots = _parse_roots(env.get(protocol.ENV_ROOTS, ""))
        self.enabled = bool(self._socket_path and self._roots)
        # the order (and its end) on one connection, the progress on its own: the daemon's front
        # door answers a progress of the order its peer lane follows in C, and keeps that
        # connection, so a frame every few files costs no interpreter there
        self._orders, self._progress = _Channel(), _Channel()
        self._pid = os.getpid()

    # -- what the reader tells ------------------------------------------------------------
    def order(self, paths: Iterable[str | bytes | os.PathLike]) -> int:
        """The coming epoch reads ``paths`` in this order; returns how many are managed."""
        if not self.enabled:
            return 0
        keys = [k for k in (self.key_of(p) for p in paths) if k is not None]
        self._send(protocol.encode_hints(protocol.HINT_ORDER, self.stream, keys))
        self._progress.close()  # its progress on a new connection: the door's if its lane follows this order
        return len(keys)

    def progress(self, consumed: int, wait: bool = True) -> None:
        """The reader is done with the first ``consumed`` paths of the order. ``wait=False``
        (the samplers' mid-epoch progress): its answer is read before the next frame that is
        waited for (an order, the end, an epoch's last progress), or once UNANSWERED_MAX are
        due, so the reader does not wait on the daemon's interpreter mid-epoch."""
        if self.enabled:
            self._send(protocol.encode_hints(protocol.HINT_PROGRESS, self.stream, consumed=max(0, consumed)),
                       wait=wait, channel=self._progress)

    def close(self) -> None:
        """The reader has gone: its order no longer steers the daemon."""
        if self.enabled and self._pid == os.getpid():
            self._send(protocol.encode_hints(protocol.HINT_END, self.stream))
        self._orders.close()
        self._progress.close()

    def __enter__(self) -> "Hints":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- paths to keys, as the shim matches them ----------------------------------------
    def key_of(self, path: str | bytes | os.PathLike) -> bytes | None:
        """The key of ``path`` (protocol.py), or None if it is under no dataset root."""
        raw = os.path.abspath(os.fsencode(path))
        for k, root in self._roots:
            if raw.startswith(root + b"/") and len(raw) > len(root) + 1:
                return str(k).encode() + b"/" + raw[len(root) + 1:]
        return None

    # -- the socket ------------------------------------------------------------------------
    def _send(self, frames: list[bytes], wait: bool = True, channel: "_Channel | None" = None) -> None:
        if self._pid != os.getpid():  # a forked child: its parent's connections are not its own
            self._orders, self._progress, self._pid = _Channel(), _Channel(), os.getpid()
        channel = channel or self._orders
        if channel is self._orders and self._progress.unanswered:
            if not self._settle(self._progress):  # an order or an end comes after the progress before it
                return
        for frame in frames:
            if not self._send_one(channel, frame, wait):
                return

    def _settle(self, channel: "_Channel") -> bool:
        try:
            channel.settle()
            return True
        except _Refused as e:
            self._give_up(f"the daemon refused a hint: {e}")
        except (OSError, protocol.ProtocolError):
            channel.close()  # a progress lost with its connection: the next one says more
        return self.enabled

    def _send_one(self, channel: "_Channel", frame: bytes, wait: bool = True) -> bool:
        for attempt in (0, 1):  # the daemon closes idle hint connections: reconnect once
            try:
                channel.send(self._socket_path, frame, wait)
                return True
            except _Refused as e:
                self._give_up(f"the daemon refused a hint: {e}")
                return False
            except (OSError, protocol.ProtocolError) as e:
                channel.close()
                if attempt:
                    self._give_up(f"cannot reach the daemon at {self._socket_path}: {e}")
        return False

    def _give_up(self, why: str) -> None:
        log.warning("monarch hints are off for this reader: %s", why)
        self.enabled = False


class HintedSampler:
    """Wraps a sampler (anything with ``__iter__``; ``__len__`` and ``set_epoch`` are passed
    through): each epoch's order is sent to the daemon before the first index is yielded,
    then the progress every ``every`` indices. ``path_of(index)`` names the file of a
    sample. ``lag``: indices handed out but maybe not read yet (DataLoader workers ×
    prefetch factor × batch size); the daemon is told only what is surely consumed."""

    def __init__(self, sampler: Any, path_of: Callable[[Any], str | bytes | os.PathLike], lag: int = 256,
                 every: int = 64, hints: Hints | None = None):
        self.sampler = sampler
        self.path_of = path_of
        self.lag = lag
        self.every = max(1, every)
        self.hints = hints if hints is not None else Hints()

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if not self.hints.enabled:
            yield from self.sampler
            return
        order = list(self.sampler)
        paths = []
        for item in order:  # a batch sampler yields lists of indices
            if isinstance(item, (list, tuple)):
                paths.extend(self.path_of(i) for i in item)
            else:
                paths.append(self.path_of(item))
        self.hints.order(paths)
        done = 0
        for n, item in enumerate(order):
            if n and n % self.every == 0:
                self.hints.progress(done - self.lag, wait=False)
            done += len(item) if isinstance(item, (list, tuple)) else 1
            yield item
        self.hints.progress(done)  # the epoch's end: waited for, with the answers before it


class DistributedHintedSampler(HintedSampler):
    """PyTorch's ``DistributedSampler``, hinted (nothing imported from torch): each epoch a
    permutation of ``range(len(dataset))`` seeded by ``seed + epoch`` (``set_epoch``; with
    ``shuffle=False`` the identity), padded by repeating its head to a multiple of
    ``num_replicas`` (or, ``drop_last``, cut to one), of which rank ``rank`` takes every
    ``num_replicas``-th from its own place (``perm[rank::num_replicas]``): the shards are
    disjoint and together cover the dataset, each ``len(self)`` long, as torch's. The
    permutation is Python's ``random.Random(seed + epoch).shuffle``, not torch's ``randperm``:
    the same shape, other numbers. ``dataset``: its length, or anything with ``__len__``.
    Each epoch's shard order is told to the daemon before its first index is yielded, then the
    progress (``HintedSampler``: ``lag``, ``every``); ``num_replicas`` and ``rank`` default to
    ``WORLD_SIZE`` and ``RANK`` (torchrun's), else 1 and 0."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, *, path_of: Callable[[int], str | bytes | os.PathLike],
                 lag: int = 256, every: int = 64, hints: Hints | None = None):
        super().__init__(_Shards(dataset if isinstance(dataset, int) else len(dataset),
                                 int(os.environ.get("WORLD_SIZE", "1")) if num_replicas is None else num_replicas,
                                 int(os.environ.get("RANK", "0")) if rank is None else rank, shuffle, seed, drop_last),
                         path_of, lag, every, hints)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch


class _Shards:
    """The index order of DistributedHintedSampler (torch's DistributedSampler's arithmetic)."""

    def __init__(self, n: int, replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool):
        if replicas < 1 or not 0 <= rank < replicas:
            raise ValueError(f"DistributedHintedSampler: rank {rank} is not in [0, {replicas}) (num_replicas {replicas})")
        self.n, self.replicas, self.rank, self.shuffle, self.seed, self.drop_last = n, replicas, rank, shuffle, seed, drop_last
        self.epoch = 0
        if drop_last and n % replicas:
            self.num_samples = -(-(n - replicas) // replicas)
        else:
            self.num_samples = -(-n // replicas)
        self.total_size = self.num_samples * replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if self.drop_last:
            order = order[:self.total_size]
        elif order:
            pad = self.total_size - len(order)
            order += (order * -(-pad // len(order)))[:pad]
        return iter(order[self.rank:self.total_size:self.replicas])


class _Channel:
    """One connection to the daemon and the answers due on it (frames not waited for)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.unanswered = 0

    def send(self, path: str, frame: bytes, wait: bool) -> None:
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(TIMEOUT)
            self.sock.connect(path)
            if not secure.peer_is_me(self.sock):
                raise OSError("the daemon's socket belongs to another user")
            self.unanswered = 0
        if wait or self.unanswered >= UNANSWERED_MAX:
            self.settle()
        self.sock.sendall(frame)
        self.unanswered += 1
        if wait:
            self.settle()

    def settle(self) -> None:
        """The answers of the frames sent and not waited for (each must be OK)."""
        while self.unanswered and self.sock is not None:
            status, body = protocol.recv_answer(self.sock)
            self.unanswered -= 1
            if status != 0:
                raise _Refused(body.decode(errors="replace"))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.unanswered = 0


def _parse_roots(text: str) -> list[tuple[int, bytes]]:
    """MONARCH_ROOTS (protocol.py) as (root index, path) pairs, longest path first."""
    roots = []
    for entry in text.split(":"):
        k, sep, path = entry.partition("=")
        if sep and k.isdigit() and path.startswith("/"):
            roots.append((int(k), os.fsencode(path.rstrip("/") or "/")))
    return sorted(roots, key=lambda r: -len(r[1]))

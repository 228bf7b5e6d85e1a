"""Compressed tiers: the zstd codec of a tier, its choice of level (and dictionary), and the
sealed in-memory copy an open of a compressed key is served from (the decoded files kept
for re-opens are the tier's: ``monarch.node.tiers.tiers.DecodedFiles``).

A tier with ``compression: zstd`` or ``auto`` stores a file compressed when that pays: the
stager hands the codec the bytes it read from the PFS (one read, as for a raw copy) and the
codec returns the stored form, or None when the file does not shrink by ``MIN_RATIO`` (JPEG,
npz, random bytes): those are kept raw, where the shim's tier probe opens them at native
speed, so incompressible data costs one trial compression per file and nothing per read.

The choice (FanStore's "select"): the sample is ``SAMPLE_FILES`` files (or ``SAMPLE_BYTES``,
whichever comes first) as they are staged, so it costs no extra PFS read; files staged
before the choice are stored with ``DEFAULT_LEVEL``. With the read-ahead, the daemon names
the sample (``sample_from``): files spread over the whole snapshot, staged first, because the
first files of a walk are one directory's (one class), which may compress unlike the rest;
until it does (``defer_sample``), the walk's files are staged but not sampled. Otherwise
(files staged as the application opens them, in its shuffled order) the first ones staged
are the sample. On the sample each
level of ``LEVELS`` is measured in CPU time (ratio, compression and decompression
throughput; the higher levels no more once one compresses below ``COMPRESS_FLOOR``); the
chosen level is the one with the best ratio among those that decompress at least at
``decompress_floor`` bytes/s (and at least twice the PFS's measured rate) and compress at
least at ``COMPRESS_FLOOR``, the lower level when ratios are within 2 %. Where the files are
small (mean under ``DICT_MEAN_MAX``) a dictionary is trained on half the sample and kept if
it improves the ratio on the other half by 10 % or more. ``auto`` turns the tier's
compression off when the sample does not shrink by ``MIN_RATIO`` overall. The choice and
the sample's figures are logged and appear in the report (``describe``).

Copies are plain zstd frames (with the content size and, with a dictionary, its id), so a
frame says how to decode it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import zstandard

log = logging.getLogger(__name__)

MODES = ("off", "zstd", "auto")
MIN_RATIO = 1.1              # a file is stored compressed only if it shrinks at least this much
MAX_FILE_BYTES = 256 << 20   # larger files are copied raw (compression holds a file in memory)
DEFAULT_LEVEL = 3
# negative levels ("fast"): ratio ~2 where level 1 gives ~4, but decompression at 11-45 GB/s
# instead of 2-3 GB/s (docs/compression.md); they are taken only where their ratio is enough
LEVELS = (-5, -1, 1, 3, 6, 9, 12)
FIT_MARGIN = 1.25            # a level "fits" if its sample ratio is this much above the ratio needed (the
                             # sample is a few MiB: the dataset's ratio at a level may be 10-15 % lower)
DICT_DIR = ".dict"           # <tier>/.z/.dict/<id>: the dictionaries frames name, for the shim
SAMPLE_FILES = 32
SAMPLE_BYTES = 16 << 20
TRIAL_BYTES = 2 << 20        # at most this much of the sample is compressed at every level
SAMPLE_PATIENCE = 8          # named sample files missing after this many files per sample file offered
                             # (staged elsewhere, no room, copied before they were named): choose without them
DECOMPRESS_FLOOR = 500e6     # bytes/s: the read path must stay well above a PFS stream
COMPRESS_FLOOR = 40e6        # bytes/s: staging must not become CPU-bound on high levels
DICT_MEAN_MAX = 64 << 10     # mean file size under which a dictionary is tried
DICT_SIZE = 112 << 10
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


@dataclass
class Choice:
    """What the selection chose and the sample figures it chose from."""
    level: int = DEFAULT_LEVEL
    dictionary: bool = False
    enabled: bool = True
    reason: str = "sampling"
    sample_files: int = 0
    sample_bytes: int = 0
    ratio: float = 0.0                 # on the sample, at the chosen level
    decompress_mbps: float = 0.0
    compress_mbps: float = 0.0
    bound_mbps: float = 0.0            # the decompression throughput the level had to reach
    candidates: list[dict] = field(default_factory=list)


def _measure(samples: list[bytes], level: int, dict_data: zstandard.ZstdCompressionDict | None = None) -> dict:
    """Ratio and throughputs of ``level`` on ``samples``, in this thread's CPU time: what the
    codec costs, not what other processes on the node took of the cores meanwhile."""
    cctx = zstandard.ZstdCompressor(level=level, dict_data=dict_data)
    dctx = zstandard.ZstdDecompressor(dict_data=dict_data)
    raw = sum(len(s) for s in samples)
    t0 = time.thread_time()
    frames = [cctx.compress(s) for s in samples]
    t1 = time.thread_time()
    for f in frames:
        dctx.decompress(f)
    t2 = time.thread_time()
    stored = sum(len(f) for f in frames)
    return {"level": level, "ratio": raw / max(1, stored), "compress_mbps": raw / max(t1 - t0, 1e-9) / 1e6,
            "decompress_mbps": raw / max(t2 - t1, 1e-9) / 1e6}


def fastcover_f(samples: list[bytes]) -> int:
    """The dictionary trainer's table (2^f counters of 4 bytes) sized to the samples' bytes: no
    more d-mers than bytes, so a table past them only costs memory. zstd's default, 20 (4 MB,
    7-11 MB of the daemon's peak at training), was for samples of megabytes; a sample of 16 small
    files is tens of kB (f 17, 0.5 MB: the same ratio within 0.2 %)."""
    return min(20, max(12, sum(map(len, samples)).bit_length() + 1))


def _best_ratio(cands: list[dict]) -> dict:
    """The best ratio, the lower level when ratios are within 2 % (it decodes faster)."""
    best = cands[0]
    for c in cands[1:]:
        if c["ratio"] > best["ratio"] * 1.02:
            best = c
    return best


def select(samples: list[bytes], mode: str = "zstd", decompress_floor: float = DECOMPRESS_FLOOR,
           pfs_rate: float | None = None, needed_ratio: float | None = None
           ) -> tuple[Choice, zstandard.ZstdCompressionDict | None]:
    """The level (and dictionary) for data like ``samples``: see the module doc.
    ``needed_ratio``: the ratio at which the dataset fits the tier (None: not known)."""
    trial, size = [], 0
    for s in samples:
        if size >= TRIAL_BYTES:
            break
        trial.append(s)
        size += len(s)
    bound = max(decompress_floor, 2 * (pfs_rate or 0.0))
    choice = Choice(sample_files=len(samples), sample_bytes=sum(len(s) for s in samples), bound_mbps=bound / 1e6)
    if not trial:
        choice.reason = "no sample"
        return choice, None
    cands = []
    for level in LEVELS:  # in rising cost: once one compresses too slowly, the higher ones would too
        cands.append(_measure(trial, level))
        if cands[-1]["compress_mbps"] * 1e6 < COMPRESS_FLOOR:
            break
    choice.candidates = [{k: round(v, 3) if isinstance(v, float) else v for k, v in c.items()} for c in cands]
    ok = [c for c in cands if c["decompress_mbps"] * 1e6 >= bound and c["compress_mbps"] * 1e6 >= COMPRESS_FLOOR]
    need = max(MIN_RATIO, needed_ratio) * FIT_MARGIN if needed_ratio else None
    # The dataset does not fit the tier raw: every file the ratio adds to the tier is a PFS
    # read saved each epoch, worth more than a decode that is still faster than the PFS.
    tight = needed_ratio is not None and needed_ratio > 1
    beats_pfs = [c for c in cands if c["decompress_mbps"] * 1e6 >= 2 * (pfs_rate or 0.0)
                 and c["compress_mbps"] * 1e6 >= COMPRESS_FLOOR]
    if need and (fit := [c for c in ok if c["ratio"] >= need]):
        best = fit[0]  # the lowest level that fits: the fastest to decompress (every read pays it)
        choice.reason = f"the fastest level whose ratio fits the dataset in the tier (needs " \
                        f"{max(MIN_RATIO, needed_ratio):.2f}x + {FIT_MARGIN - 1:.0%})"
    elif tight and (fit := [c for c in beats_pfs if c["ratio"] >= need]):
        best = fit[0]
        choice.reason = f"the fastest level whose ratio fits the dataset in the tier (needs " \
                        f"{max(MIN_RATIO, needed_ratio):.2f}x + {FIT_MARGIN - 1:.0%}), below {bound / 1e6:.0f} " \
                        f"MB/s: a file kept in the tier is a PFS read saved each epoch"
    elif tight and beats_pfs:
        best = _best_ratio(beats_pfs)
        choice.reason = f"no level fits the dataset in the tier (needs {max(MIN_RATIO, needed_ratio):.2f}x + " \
                        f"{FIT_MARGIN - 1:.0%}): the best ratio decompressing faster than the PFS"
    elif not ok:  # nothing meets the bound: the fastest to decompress
        best = max(cands, key=lambda c: c["decompress_mbps"])
        choice.reason = f"no level decompresses at {bound / 1e6:.0f} MB/s; the fastest"
    else:
        best = _best_ratio(ok)
        choice.reason = f"best ratio decompressing at >= {bound / 1e6:.0f} MB/s and compressing at >= " \
                        f"{COMPRESS_FLOOR / 1e6:.0f} MB/s"
    choice.level, choice.ratio = best["level"], best["ratio"]
    choice.compress_mbps, choice.decompress_mbps = best["compress_mbps"], best["decompress_mbps"]
    dict_data = None
    if len(trial) >= 16 and size / len(trial) <= DICT_MEAN_MAX:
        train, test = trial[0::2], trial[1::2]
        try:
            d = zstandard.train_dictionary(min(DICT_SIZE, max(4096, sum(map(len, train)) // 4)), train,
                                           f=fastcover_f(train))
            with_dict = _measure(test, choice.level, d)
            without = _measure(test, choice.level)
            choice.candidates.append({"dictionary": True, **with_dict, "without": round(without["ratio"], 3)})
            if with_dict["ratio"] >= without["ratio"] * 1.1 and with_dict["decompress_mbps"] * 1e6 >= bound:
                dict_data, choice.dictionary = d, True
                choice.ratio = with_dict["ratio"]
                choice.reason += f"; a {len(d.as_bytes())}-byte dictionary: ratio {with_dict['ratio']:.2f} " \
                                 f"instead of {without['ratio']:.2f}"
        except zstandard.ZstdError as e:
            choice.candidates.append({"dictionary": False, "error": str(e)})
    if mode == "auto" and choice.ratio < MIN_RATIO:
        choice.enabled = False
        choice.reason = f"auto: the sample shrinks {choice.ratio:.2f}x (< {MIN_RATIO}x): compression off"
    return choice, dict_data


class Codec:
    """The compression of one tier (thread-safe)."""

    def __init__(self, mode: str, pfs_rate: Callable[[], float | None] = lambda: None,
                 decompress_floor: float = DECOMPRESS_FLOOR, sample_files: int = SAMPLE_FILES,
                 sample_bytes: int = SAMPLE_BYTES, needed_ratio: Callable[[], float | None] = lambda: None,
                 dict_dir: str | None = None):
        if mode not in ("zstd", "auto"):
            raise ValueError(f"compression {mode!r}: expected one of zstd, auto")
        self.mode = mode
        self._pfs_rate = pfs_rate
        self._needed_ratio = needed_ratio
        self._dict_dir = dict_dir  # where the shim finds a dictionary (None: frames with one are the daemon's)
        self._floor = decompress_floor
        self._want_files, self._want_bytes = sample_files, sample_bytes
        self._lock = threading.Lock()
        self._sample: list[bytes] | None = []
        self._sample_size = 0
        self._sample_keys: set[str] | None = None  # the files the sample is taken from (None: the first staged)
        self._deferred = False                     # sample nothing until told which files (sample_from)
        self._offered = 0                          # files offered since sample_from
        self._early: list[str] = []                # stored compressed before the choice (DEFAULT_LEVEL)
        self.choice = Choice()
        self._level = DEFAULT_LEVEL
        self._dict: zstandard.ZstdCompressionDict | None = None
        self._dicts: dict[int, zstandard.ZstdCompressionDict] = {}
        self._generation = 0
        self._cctxs = self._compressors()  # the level's and dictionary's (replaced with them)
        self._dctxs: dict[int, Contexts] = {}  # by dictionary id (0: none)
        self.files_compressed = 0
        self.files_raw = 0
        self.logical_in = 0     # bytes offered
        self.stored_out = 0     # bytes stored for them (compressed or raw)

    # -- staging -------------------------------------------------------------------------
    def wants(self, size: int) -> bool:
        return self.choice.enabled and 0 < size <= MAX_FILE_BYTES

    def estimate(self, size: int) -> int:
        """Stored bytes expected for a file of ``size`` (for room checks before reading it)."""
        with self._lock:
            ratio = self.logical_in / self.stored_out if self.stored_out else 1.0
        return int(size / max(1.0, ratio)) + 1

    def encode(self, data, key: str | None = None) -> bytes | None:
        """The stored form of ``data`` (a bytes-like object, the file ``key``), or None: keep it raw."""
        self._take_sample(data, key)
        if not self.choice.enabled:
            return self._account(len(data), None)
        with self._lock:
            generation, cctxs = self._generation, self._cctxs
        with cctxs.lent() as cctx:
            out = cctx.compress(data)
        out = self._account(len(data), out if len(data) >= MIN_RATIO * len(out) else None)
        if out is not None and generation == 0 and key is not None:
            with self._lock:
                self._early.append(key)
        return out

    def take_early(self) -> list[str]:
        """Once the level is chosen, the files stored compressed before it, once (else [])."""
        with self._lock:
            if self._generation == 0 or not self._early:
                return []
            early, self._early = self._early, []
            return early

    def reencode(self, data) -> bytes:
        """``data`` compressed as the tier's files are now (the chosen level and dictionary)."""
        with self._cctxs.lent() as cctx:
            return cctx.compress(data)

    def recoded(self, saved: int) -> None:
        """A copy was re-encoded, ``saved`` stored bytes smaller."""
        with self._lock:
            self.stored_out -= saved

    def _account(self, size: int, out: bytes | None) -> bytes | None:
        with self._lock:
            self.logical_in += size
            self.stored_out += size if out is None else len(out)
            if out is None:
                self.files_raw += 1
            else:
                self.files_compressed += 1
        return out

    def _compressors(self) -> Contexts:
        level, dict_data = self._level, self._dict
        return Contexts(lambda: zstandard.ZstdCompressor(level=level, dict_data=dict_data, write_content_size=True))

    @property
    def sample_files(self) -> int:
        return self._want_files

    def defer_sample(self) -> None:
        """Take no file into the sample until ``sample_from`` names them."""
        with self._lock:
            self._deferred = True

    def sample_from(self, keys) -> None:
        """The sample is these files (spread over the dataset), as they are staged; none: choose now."""
        with self._lock:
            if self._sample is None:
                return
            self._sample_keys, self._offered = set(keys), 0
            empty = not self._sample_keys
        if empty:
            self.finish_sample()

    def _take_sample(self, data, key: str | None) -> None:
        if self._sample is None:
            return
        with self._lock:
            if self._sample is None:
                return
            if self._sample_keys is not None:  # the named files only
                self._offered += 1
                named = key in self._sample_keys
                self._sample_keys.discard(key)
                waited = not self._sample_keys or self._offered >= SAMPLE_PATIENCE * max(1, self._want_files)
            elif self._deferred:
                return
            else:
                named, waited = True, False
            if named and self._sample_size < self._want_bytes:
                self._sample.append(bytes(data[:1 << 20]))
                self._sample_size += min(len(data), 1 << 20)
            if not waited and len(self._sample) < self._want_files and self._sample_size < self._want_bytes:
                return
            samples, self._sample = self._sample, None
        self._choose(samples)

    def finish_sample(self) -> None:
        """Choose from what was sampled so far (a dataset smaller than the sample)."""
        with self._lock:
            samples, self._sample = self._sample, None
        if samples:
            self._choose(samples)

    def _choose(self, samples: list[bytes]) -> None:
        choice, dict_data = select(samples, self.mode, self._floor, self._pfs_rate(), self._needed_ratio())
        if dict_data is not None:
            self._publish_dictionary(dict_data)  # before any frame names it
        with self._lock:
            if dict_data is not None:
                self._dicts[dict_data.dict_id()] = dict_data
            self._level, self._dict = choice.level, dict_data
            self.choice = choice
            self._generation += 1
            self._cctxs = self._compressors()
        log.info("compression: level %d%s, sample %d files %d bytes: ratio %.2f, decompression %.0f MB/s, "
                 "compression %.0f MB/s (%s)", choice.level, " with a dictionary" if choice.dictionary else "",
                 choice.sample_files, choice.sample_bytes, choice.ratio, choice.decompress_mbps,
                 choice.compress_mbps, choice.reason)

    def _publish_dictionary(self, dict_data: zstandard.ZstdCompressionDict) -> None:
        """``<dict_dir>/<id>`` (owner-only, atomically): the shim decodes frames that name it
        in the application's process; without it they are decoded by the daemon."""
        if self._dict_dir is None:
            return
        from monarch.secure import write_file_atomically
        try:
            os.makedirs(self._dict_dir, mode=0o700, exist_ok=True)
            write_file_atomically(os.path.join(self._dict_dir, str(dict_data.dict_id())), dict_data.as_bytes())
        except OSError as e:
            log.warning("compression: the dictionary is not written for the shim (%s); the daemon decodes the "
                        "frames that use it", e)

    # -- serving -------------------------------------------------------------------------
    def decode(self, path: str, size: int) -> bytes:
        """The ``size`` bytes that the frame at ``path`` decodes to; OSError or
        zstandard.ZstdError when it does not.

        The fast path: the frame is read with one read and decoded by this thread's reused
        decompression context (zstd releases the GIL)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            frame = os.read(fd, os.fstat(fd).st_size + 1)
        finally:
            os.close(fd)
        with self._decompressors(frame, path).lent() as dctx:
            data = dctx.decompress(frame, max_output_size=size)
        if len(data) != size:
            raise OSError(f"{path}: decodes to {len(data)} bytes, the snapshot says {size}")
        return data

    def inflate(self, path: str, size: int, name: str = "monarch") -> int:
        """A sealed memfd (read-only for everyone) holding what ``decode`` gives, written
        with one write (no Python copy of the decoded bytes)."""
        return sealed_memfd(self.decode(path, size), name)

    def _decompressors(self, frame: bytes, path: str) -> Contexts:
        dict_id = zstandard.get_frame_parameters(frame).dict_id
        with self._lock:
            pool = self._dctxs.get(dict_id)
            if pool is None:
                dict_data = self._dicts.get(dict_id) if dict_id else None
                if dict_id and dict_data is None:
                    raise OSError(f"{path}: frame needs dictionary {dict_id}, which this tier does not hold")
                pool = self._dctxs[dict_id] = Contexts(lambda: zstandard.ZstdDecompressor(dict_data=dict_data))
        return pool

    def describe(self) -> dict:
        with self._lock:
            c = asdict(self.choice)
            return {"mode": self.mode, "level": c["level"], "dictionary": c["dictionary"], "enabled": c["enabled"],
                    "files_compressed": self.files_compressed, "files_raw": self.files_raw,
                    "selection": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in c.items()}}


class Contexts:
    """zstd contexts lent to whichever thread compresses (or decodes) now and kept for the next
    one. A context holds ~100 kB of tables: one per thread would be 25 MB at the 256 threads of a
    stager's read-ahead, where about a core's worth work at once (zstd releases the GIL). At most
    ``KEEP`` are kept; more are made while more threads are inside zstd at once."""

    KEEP = max(4, 2 * (os.cpu_count() or 1))

    def __init__(self, make: Callable[[], object]):
        self._make = make
        self._free: list = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lent(self) -> Iterator:
        with self._lock:
            ctx = self._free.pop() if self._free else None
        if ctx is None:
            ctx = self._make()
        try:
            yield ctx
        finally:
            with self._lock:
                if len(self._free) < self.KEEP:
                    self._free.append(ctx)


def sealed_memfd(data, name: str = "monarch") -> int:
    """A memfd holding ``data``, sealed against every change, offset 0 (the caller owns it)."""
    mfd = os.memfd_create(name[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.write(mfd, view[done:])
        fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, SEALS)
        os.lseek(mfd, 0, os.SEEK_SET)
    except BaseException:
        os.close(mfd)
        raise
    return mfd


def make_codec(mode: str, pfs_rate: Callable[[], float | None] = lambda: None,
               needed_ratio: Callable[[], float | None] = lambda: None, dict_dir: str | None = None) -> Codec | None:
    return None if mode == "off" else Codec(mode, pfs_rate, needed_ratio=needed_ratio, dict_dir=dict_dir)


def needs_dictionary(path: str) -> bool:
    """Does the zstd frame at ``path`` name a dictionary (or cannot be read)?"""
    try:
        with open(path, "rb") as f:
            return zstandard.get_frame_parameters(f.read(18)).dict_id != 0
    except (OSError, zstandard.ZstdError):
        return True

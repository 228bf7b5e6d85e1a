"""Compressed tiers: the codec's selection, the stager's accounting in stored bytes, and
the sealed memfd an open is served from (the decoded files kept for re-opens: test_decoded.py)."""

import fcntl
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import zstandard

from monarch.node.tiers import codecs
from monarch.node.tiers.codecs import Codec, select
from monarch.config import TierConfig
from monarch.node.tiers.resources import allocated_size, allocation_unit
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.node.stage.stager import Stager
from monarch.node.tiers.tiers import Tier


def compressible(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefgh") for _ in range(rng.randint(3, 9))) for _ in range(40)]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def tier(tmp_path, capacity, compression="zstd", name="ram", slot=2):
    (tmp_path / name).mkdir(exist_ok=True)
    return Tier.from_config(TierConfig(name, str(tmp_path / name), capacity, False, compression=compression), slot, "r1", 0, ())


@pytest.fixture
def mixed(tmp_path):
    """10 compressible files of 20 KB and 10 random ones of 20 KB."""
    root = tmp_path / "pfs"
    (root / "z").mkdir(parents=True)
    (root / "r").mkdir()
    for i in range(10):
        (root / "z" / f"{i}.txt").write_bytes(compressible(20_000, i))
        (root / "r" / f"{i}.jpg").write_bytes(os.urandom(20_000))
    return take_snapshot((str(root),))


# -- selection ----------------------------------------------------------------------------
def test_selection_measures_every_level_and_keeps_the_bound():
    samples = [compressible(50_000, i) for i in range(8)]
    choice, _ = select(samples, decompress_floor=1.0)
    levels = [c["level"] for c in choice.candidates if "level" in c and "dictionary" not in c]
    assert levels == list(codecs.LEVELS)[:len(levels)] and len(levels) >= 2  # in order, stopping when too slow
    assert all(c["compress_mbps"] * 1e6 >= codecs.COMPRESS_FLOOR for c in choice.candidates[:len(levels) - 1])
    assert choice.ratio > 2 and choice.level in codecs.LEVELS and choice.enabled
    assert choice.sample_files == 8 and choice.sample_bytes == 400_000
    # a bound no level can meet: the fastest to decompress is taken, and the reason says so
    choice, _ = select(samples, decompress_floor=1e15)
    assert "no level decompresses" in choice.reason
    fastest = max((c for c in choice.candidates if "dictionary" not in c), key=lambda c: c["decompress_mbps"])
    assert choice.level == fastest["level"]


def test_a_fast_level_is_taken_only_where_its_ratio_fits_the_dataset_in_the_tier(monkeypatch):
    # every level measured, however slowly a loaded machine compresses: this is about the fit
    monkeypatch.setattr(codecs, "COMPRESS_FLOOR", 0)
    samples = [compressible(50_000, i) for i in range(8)]
    roomy, _ = select(samples, decompress_floor=1.0, needed_ratio=1.0)  # the dataset fits raw
    assert roomy.level == min(codecs.LEVELS) < 1 and "fits the dataset" in roomy.reason, roomy
    tight, _ = select(samples, decompress_floor=1.0, needed_ratio=roomy.ratio * 1.5)
    assert tight.level > roomy.level and tight.ratio > roomy.ratio
    unknown, _ = select(samples, decompress_floor=1.0)  # the walk has not ended: the best ratio, as before
    assert "best ratio" in unknown.reason and unknown.ratio >= tight.ratio * 0.98


def test_a_dataset_that_does_not_fit_raw_takes_the_ratio_over_the_floor(monkeypatch):
    """No level decodes at the floor (here an impossible one), but the dataset needs 1.2x to
    fit the tier: the lowest level that fits is taken, as every file it keeps is a PFS read
    saved; when nothing fits, the best ratio (never the fastest, ratio-poor level)."""
    monkeypatch.setattr(codecs, "COMPRESS_FLOOR", 0)
    samples = [compressible(50_000, i) for i in range(8)]
    every, _ = select(samples, decompress_floor=1.0)
    ratios = {c["level"]: c["ratio"] for c in every.candidates if "dictionary" not in c}
    need = 1.2
    fits, _ = select(samples, decompress_floor=1e15, needed_ratio=need)
    assert fits.level == min(lv for lv, r in ratios.items() if r >= need * codecs.FIT_MARGIN)
    assert "saved each epoch" in fits.reason, fits.reason
    beyond, _ = select(samples, decompress_floor=1e15, needed_ratio=100.0)
    assert "no level fits" in beyond.reason and beyond.ratio >= max(ratios.values()) / 1.02 - 0.05
    fitting_raw, _ = select(samples, decompress_floor=1e15, needed_ratio=0.5)  # fits raw: decode speed first
    assert "no level decompresses" in fitting_raw.reason


def test_the_pfs_rate_raises_the_bound():
    choice, _ = select([compressible(10_000)], decompress_floor=1.0, pfs_rate=3e9)
    assert choice.bound_mbps == 6000.0


def test_auto_turns_compression_off_for_incompressible_data():
    choice, _ = select([os.urandom(50_000) for _ in range(4)], mode="auto")
    assert not choice.enabled and "compression off" in choice.reason
    choice, _ = select([os.urandom(50_000) for _ in range(4)], mode="zstd")
    assert choice.enabled  # zstd keeps trying per file (each incompressible one stays raw)


def test_small_files_with_shared_structure_get_a_dictionary():
    header = bytes(range(256)) * 8  # a 2 KiB header every file shares, then a small varying body
    samples = [header + b"id=%06d;" % i + os.urandom(64) for i in range(64)]
    choice, d = select(samples, decompress_floor=1.0)
    assert choice.dictionary and d is not None, choice
    codec = Codec("zstd", decompress_floor=1.0, sample_files=64)
    for s in samples:
        codec.encode(s)
    assert codec.choice.dictionary
    frame = codec.encode(header + b"id=999999;" + os.urandom(64))
    assert zstandard.get_frame_parameters(frame).dict_id == d.dict_id()


def test_a_tier_made_from_its_config_chooses_its_level_once_the_sample_is_in(tmp_path):
    """The daemon's tiers come from Tier.from_config, with the dataset's size: the 32nd file
    staged ends the sample and the level is chosen for the ratio the dataset needs (a
    NameError there once failed that file's copy and left every tier at the sampling level)."""
    (tmp_path / "ram").mkdir()
    cfg = TierConfig("ram", str(tmp_path / "ram"), 2_000_000, False, compression="zstd")
    t = Tier.from_config(cfg, 2, "r1", 0, (), dataset_bytes=lambda: 4_000_000)
    for i in range(codecs.SAMPLE_FILES):
        assert t.codec.encode(compressible(20_000, i)) is not None
    choice = t.codec.choice
    assert choice.sample_files == codecs.SAMPLE_FILES and choice.reason != "sampling"
    assert "fits the dataset in the tier (needs 2.00x" in choice.reason


def test_a_deferred_sample_is_the_named_files_not_the_first_ones_staged():
    """The walk stages one directory first: a codec told to wait takes none of those into its
    sample, then exactly the files the read-ahead names (spread over the dataset), so the
    ratio it chooses on is theirs. Before, the first 32 files staged were the sample."""
    c = Codec("zstd")
    c.defer_sample()
    for i in range(40):  # the first directory: nearly random bytes
        c.encode(random.Random(i).randbytes(20_000), f"a/{i}")
    assert c.choice.reason == "sampling"
    named = [f"b/{i}" for i in range(codecs.SAMPLE_FILES)]
    c.sample_from(named)
    for i, key in enumerate(named):
        c.encode(random.Random(i).randbytes(20_000), f"a/x{i}")  # not named: still not sampled
        c.encode(compressible(20_000, i), key)
    assert c.choice.reason != "sampling" and c.choice.sample_files == codecs.SAMPLE_FILES
    assert c.choice.ratio > 2.5, c.choice  # the named text's ratio, not the random bytes' ~1.0


def test_named_sample_files_that_never_come_do_not_hold_the_choice_forever():
    c = Codec("zstd")
    c.sample_from([f"gone/{i}" for i in range(codecs.SAMPLE_FILES)])
    c.encode(compressible(20_000, 0), "gone/0")
    for i in range(codecs.SAMPLE_PATIENCE * codecs.SAMPLE_FILES - 2):
        c.encode(compressible(20_000, i), f"other/{i}")
    assert c.choice.reason == "sampling"
    c.encode(compressible(20_000, 1), "other/last")
    assert c.choice.reason != "sampling" and c.choice.sample_files == 1


def test_codec_keeps_incompressible_files_raw_and_counts_both():
    codec = Codec("zstd", sample_files=2)
    assert codec.encode(os.urandom(10_000)) is None
    frame = codec.encode(compressible(10_000))
    assert frame is not None and zstandard.ZstdDecompressor().decompress(frame) == compressible(10_000)
    assert codec.files_raw == 1 and codec.files_compressed == 1
    assert codec.choice.reason != "sampling"  # two files: the sample is complete, the choice made
    assert codec.describe()["selection"]["sample_files"] == 2


def test_inflate_gives_a_sealed_read_only_memfd(tmp_path):
    codec = Codec("zstd")
    data = compressible(100_000)
    path = tmp_path / "f.zst"
    path.write_bytes(codec.encode(data))
    fd = codec.inflate(str(path), len(data))
    try:
        assert os.pread(fd, len(data) + 1, 0) == data and os.lseek(fd, 0, os.SEEK_CUR) == 0
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & codecs.SEALS == codecs.SEALS
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="snapshot says"):
        codec.inflate(str(path), len(data) - 1)


# -- the stager ------------------------------------------------------------------------------
def test_stager_stores_compressible_files_compressed_and_the_rest_raw(tmp_path, mixed):
    t = tier(tmp_path, 10**7)
    stager = Stager(mixed, [t], threads=2)
    for key in mixed.files:
        assert stager.ensure(key).result(timeout=20) is t
    z = [k for k in mixed.files if k.endswith(".txt")]
    r = [k for k in mixed.files if k.endswith(".jpg")]
    assert all(t.is_compressed(k) and os.path.exists(t.compressed_path_for(k)) and not os.path.exists(t.path_for(k))
               for k in z)
    assert all(not t.is_compressed(k) and os.path.exists(t.path_for(k)) for k in r)
    stored = sum(os.path.getsize(t.copy_path(k)) for k in mixed.files)
    assert t.used == t.stored == stored < mixed.total_bytes == t.logical
    assert stager.stats()["pfs_bytes_read"] == mixed.total_bytes  # one PFS read per file
    assert stager.stats()["bytes"] == mixed.total_bytes
    d = t.describe()
    assert d["logical_bytes"] == mixed.total_bytes and d["stored_bytes"] == stored
    assert d["compressed_files"] == 10 and d["ratio"] == round(mixed.total_bytes / stored, 3)
    for k in z:  # the copy decodes to the source's bytes
        fd = t.codec.inflate(t.compressed_path_for(k), mixed.files[k].size)
        assert os.pread(fd, 10**6, 0) == open(mixed.source_path(k), "rb").read()
        os.close(fd)


def staged_text(tmp_path, n: int):
    """n compressible files of 30 KB staged into a zstd tier: (snapshot, tier, stager)."""
    root = tmp_path / "pfs"
    (root / "d").mkdir(parents=True)
    for i in range(n):
        (root / "d" / f"{i:02d}.txt").write_bytes(compressible(30_000, i))
    snap = take_snapshot((str(root),))
    t = tier(tmp_path, 10**7)
    stager = Stager(snap, [t], threads=2)
    for key in sorted(snap.files):
        assert stager.ensure(key).result(timeout=20) is t
    return snap, t, stager


def test_files_stored_before_the_choice_are_re_encoded_at_the_chosen_level(tmp_path, monkeypatch):
    """The sample's files (and any staged meanwhile) are stored at DEFAULT_LEVEL; once the
    level is chosen they are re-encoded from their frames (no PFS read) and the room freed:
    every frame ends as the chosen level makes it, the accounts equal the files on disk."""
    real_select = codecs.select

    def select_9(*args, **kwargs):  # the choice itself depends on the cores' load: fixed here
        choice, dict_data = real_select(*args, **kwargs)
        choice.level, choice.dictionary = 9, False
        return choice, None

    monkeypatch.setattr(codecs, "select", select_9)
    snap, t, stager = staged_text(tmp_path, 48)
    level = t.codec.choice.level
    assert t.codec.choice.reason != "sampling" and level != codecs.DEFAULT_LEVEL, t.codec.choice
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    want = {k: len(cctx.compress(open(snap.source_path(k), "rb").read())) for k in snap.files}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(os.path.getsize(t.copy_path(k)) != n for k, n in want.items()):
        time.sleep(0.05)
    assert {k: os.path.getsize(t.copy_path(k)) for k in snap.files} == want
    assert t.used == t.stored == sum(want.values())
    assert stager.stats()["pfs_bytes_read"] == snap.total_bytes  # one PFS read per file
    for k in snap.files:
        fd = t.codec.inflate(t.compressed_path_for(k), snap.files[k].size)
        assert os.pread(fd, 10**6, 0) == open(snap.source_path(k), "rb").read()
        os.close(fd)
    stager.shutdown()


def test_a_copy_written_or_dropped_meanwhile_is_never_re_encoded_back(tmp_path, monkeypatch):
    """The job writes a file while its frame is being re-encoded: the rename is refused
    under the stager's lock, so no frame of the old bytes reappears, and the room stays right."""
    from monarch.node.stage import stager_recode
    from monarch.node.tiers import tiers as tiers_mod
    snap, t, stager = staged_text(tmp_path, 4)
    keys = sorted(snap.files)
    assert t.codec.choice.reason == "sampling"  # 4 files: no choice, every frame at DEFAULT_LEVEL
    t.codec.reencode = lambda data: (stager.invalidate(keys[0]),  # the job's write, mid-way
                                     zstandard.ZstdCompressor(level=19).compress(data))[1]
    assert stager_recode.recode(stager, t, keys[:1]) == (0, 0)
    assert not os.path.exists(t.compressed_path_for(keys[0])) and not t.is_compressed(keys[0])
    assert t.used == t.stored == sum(os.path.getsize(t.copy_path(k)) for k in keys[1:])
    assert [n for n in os.listdir(os.path.dirname(t.compressed_path_for(keys[0])))
            if n.startswith(tiers_mod.TMP_PREFIX)] == []  # no temporary file left
    stager.shutdown()


def test_compression_holds_more_than_the_capacity_in_logical_bytes(tmp_path):
    root = tmp_path / "pfs"
    root.mkdir()
    for i in range(20):
        (root / f"{i}.txt").write_bytes(compressible(20_000, i))
    snap = take_snapshot((str(root),))
    cap = 10 * allocated_size(20_000, allocation_unit(str(tmp_path)))  # room for 10 of the files, raw
    plain, packed = tier(tmp_path, cap, "off", "plain"), tier(tmp_path, cap, "zstd", "packed")
    for t in (plain, packed):
        stager = Stager(snap, [t], threads=2)
        for key in sorted(snap.files):
            stager.ensure(key).result(timeout=20)
    assert plain.files == 10 and plain.logical == 200_000
    assert packed.files == 20 and packed.logical == 400_000 and packed.used <= 200_000


def test_a_compressed_copy_is_dropped_on_invalidate_and_its_bytes_released(tmp_path, mixed):
    t = tier(tmp_path, 10**7)
    stager = Stager(mixed, [t], threads=2)
    key = next(k for k in mixed.files if k.endswith(".txt"))
    stager.ensure(key).result(timeout=20)
    assert t.is_compressed(key) and t.used > 0
    stager.invalidate(key)
    assert not os.path.exists(t.compressed_path_for(key)) and not t.is_compressed(key)
    assert t.used == 0 and t.logical == 0 and t.stored == 0 and t.files == 0


def test_a_full_compressed_tier_passes_the_bytes_read_to_the_next_tier_without_a_second_read(tmp_path, mixed):
    small, big = tier(tmp_path, 10, "zstd", "small", 2), tier(tmp_path, 10**7, "off", "big", 3)
    stager = Stager(mixed, [small, big], threads=2)
    key = next(k for k in mixed.files if k.endswith(".txt"))
    # fits() lets it try (nothing stored yet), reserve() refuses the frame: the next tier gets the bytes
    small.codec.estimate = lambda size: 1
    assert stager.ensure(key).result(timeout=20) is big
    assert open(big.path_for(key), "rb").read() == open(mixed.source_path(key), "rb").read()
    assert stager.stats()["pfs_files_read"] == 1 and stager.stats()["pfs_bytes_read"] == mixed.files[key].size


def test_a_file_read_for_a_trial_compression_always_finds_a_tier(tmp_path):
    """Incompressible files, a compressing tier that fills while many copies are in flight:
    every file the stager reads from the PFS is staged (before, some were read for a trial,
    found the tier filled meanwhile, and the application read them from the PFS again)."""
    root = tmp_path / "pfs"
    root.mkdir()
    for i in range(60):
        (root / f"{i}.jpg").write_bytes(os.urandom(20_000))
    snap = take_snapshot((str(root),))
    t = tier(tmp_path, 20 * 20_000)
    stager = Stager(snap, [t], threads=16)
    for f in [stager.ensure(k) for k in sorted(snap.files)]:
        f.result(timeout=30)
    s = stager.stats()
    assert s["files"] == t.files > 0 and s["pfs_files_read"] == s["files"]


def test_threads_share_a_few_contexts_not_one_each(monkeypatch, tmp_path):
    """A stager's read-ahead runs up to 256 threads: a zstd context each (~100 kB) was 25 MB of
    the daemon. 64 threads alive at once, encoding and decoding one after another, make one
    context of each kind, and every frame decodes to its bytes."""
    codec = Codec("zstd", sample_files=2)
    for i in range(2):
        codec.encode(compressible(10_000, i))
    assert codec.choice.reason != "sampling" and codec.choice.enabled
    made = {"c": 0, "d": 0}
    real_c, real_d = zstandard.ZstdCompressor, zstandard.ZstdDecompressor

    def counted(kind, real):
        def make(*a, **k):
            made[kind] += 1
            return real(*a, **k)
        return make

    monkeypatch.setattr(zstandard, "ZstdCompressor", counted("c", real_c))
    monkeypatch.setattr(zstandard, "ZstdDecompressor", counted("d", real_d))
    turn, done = threading.Lock(), threading.Barrier(64)
    wrong = []

    def work(i, path):
        with turn:
            data = compressible(5_000 + i, i)
            frame = codec.encode(data)
            with open(path, "wb") as f:
                f.write(frame)
            if codec.decode(str(path), len(data)) != data:
                wrong.append(i)
        done.wait(timeout=30)  # every thread alive until all have worked

    threads = [threading.Thread(target=work, args=(i, tmp_path / f"frame-{i}")) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and made["c"] <= 1 and made["d"] <= 1, made


DICT_PEAK = r'''
import json, random, sys
from monarch.node.tiers import codecs
def rec(i):
    r = random.Random(i)
    return json.dumps([{"id": r.randrange(10**6), "label": r.choice(["cat", "dog", "bird"]),
                        "caption": " ".join(r.choice(["a", "photo", "of", "small", "red", "on"]) for _ in range(12))}
                       for _ in range(r.randrange(8, 30))]).encode()
samples = [rec(i) for i in range(32)]
hwm = lambda: int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
before = hwm()
choice, d = codecs.select(samples, "zstd")
print(hwm() - before, int(d is not None))
'''


def test_a_dictionary_is_trained_with_a_table_the_size_of_its_samples():
    """The trainer's default table (f 20: 4 MB of counters) raised a daemon's peak by 7-11 MB to
    train on 16 small files; sized to the samples' bytes it takes well under 4 MB."""
    grew, _ = map(int, subprocess.run([sys.executable, "-c", DICT_PEAK], capture_output=True, text=True,
                                      check=True).stdout.split())  # (whether the dictionary is chosen or not)
    assert grew < 4096, f"selecting a level grew the peak by {grew} kB"
    assert codecs.fastcover_f([b"x" * 40_000] * 2) == 18 and codecs.fastcover_f([b"x"]) == 12
    assert codecs.fastcover_f([b"x" * (16 << 20)]) == 20

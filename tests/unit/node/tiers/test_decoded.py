"""The decoded working set of a compressing tier (``monarch.node.tiers.tiers.DecodedFiles``): an open
of a compressed copy keeps its decoded bytes at ``<tier>/<key>``, where the shim's probe
finds them; everything that removes or invalidates the copy removes that file too, a
decode racing an invalidation never publishes old bytes, and the budget holds."""

import os
import stat
import threading
import time

import pytest

from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.outcomes import Outcome
from monarch.node.snapshot.snapshot import FileInfo, take_snapshot
from monarch.node.stage.stager import Stager
from monarch.node.tiers.tiers import DecodedFiles, Tier

from test_codecs import compressible, tier  # noqa: E402 (tests/unit is on sys.path: pytest's prepend mode)
from support.harness import NO_RESERVE, make_bases, resolve

SIZE = 50_000
INFO = FileInfo(0, 0, 0o100644)  # a source's stat, for DecodedFiles.put


def compressed_daemon(tmp_path, decoded_cache="room", capacity="1MiB", keep=False, files=4):
    root = tmp_path / "pfs"
    if not root.exists():
        root.mkdir()
        for i in range(files):
            (root / f"{i}.txt").write_bytes(compressible(SIZE, i))
        (root / "sub").mkdir()
        (root / "sub" / "x.txt").write_bytes(compressible(SIZE, 9))
        (root / "sub" / "y.txt").write_bytes(compressible(SIZE, 10))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""dataset: {{roots: ["{root}"]}}
run_base: "{tmp_path}/run"
tiers: [{{name: ram, path: "{tmp_path}/ram", capacity: {capacity}, compression: zstd, decoded_cache: {decoded_cache},
         keep: {str(keep).lower()}}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 5, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    return NodeDaemon(load_config(str(cfg), env={"USER": "u"}), "r1"), root


def answer_of(d, key):
    """What the shim gets for an OPEN (resolve_now first, as the event loop does)."""
    return d.resolver.resolve_now(key) or resolve(d, key)


def read_answer(answer) -> bytes:
    """The bytes the shim would read from an answer (a passed memfd, or the path it names)."""
    if answer[0] & protocol.ANSWER_FD:
        fd = answer[1]
    else:
        fd = os.open(answer[1], os.O_RDONLY)
    try:
        return os.pread(fd, 10**7, 0)
    finally:
        os.close(fd)


def wait_kept(t: Tier, key: str, timeout: float = 10.0) -> None:
    """The inflate thread keeps the file after it answered: wait for it."""
    deadline = time.monotonic() + timeout
    while not t.decoded.holds(key):
        assert time.monotonic() < deadline, f"{key} was not kept: {t.decoded.describe()}"
        time.sleep(0.005)


def test_an_open_keeps_the_decoded_bytes_where_the_probe_looks(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        t, key = d.tiers[0], "0/0.txt"
        want = (root / "0.txt").read_bytes()
        first = answer_of(d, key)
        assert first[0] == t.slot | protocol.ANSWER_FD and read_answer(first) == want  # decoded now: a memfd
        wait_kept(t, key)
        path = t.path_for(key)
        assert open(path, "rb").read() == want
        st, src = os.stat(path), os.stat(root / "0.txt")
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0 and st.st_mtime_ns == src.st_mtime_ns
        # the copy is still the compressed one: where/is_compressed and the accounts say so
        assert d.stager.where(key) is t and t.is_compressed(key)
        assert t.used == t.stored == os.path.getsize(t.compressed_path_for(key)) < SIZE
        assert t.describe()["decoded_cache"] | {"budget": 0} == {
            "bytes": SIZE, "files": 1, "budget": 0, "kept": 1, "evicted": 0, "refused": 0, "answered": 0}
        # a shim that asks anyway (staging.validate: open) is told that path, on the event loop
        assert d.resolver.resolve_now(key) == (t.slot, path)
        assert d.outcomes["already_staged:decoded"] == 1 and t.decoded.answered == 1
        assert d.resolver.inflated_bytes == SIZE  # decoded once
        assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".monarch-tmp")]
    finally:
        d.close()
    assert not os.path.exists(path)


def test_decoded_cache_off_keeps_no_file_and_decodes_every_open(tmp_path):
    d, root = compressed_daemon(tmp_path, decoded_cache="off")
    try:
        t = d.tiers[0]
        assert t.decoded is None
        for _ in range(2):
            answer = answer_of(d, "0/2.txt")
            assert answer[0] & protocol.ANSWER_FD and read_answer(answer) == (root / "2.txt").read_bytes()
        assert d.resolver.inflated_bytes == 2 * SIZE and not os.path.exists(t.path_for("0/2.txt"))
    finally:
        d.close()


def test_invalidate_removes_the_decoded_file_of_a_file_and_of_a_directory(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        t = d.tiers[0]
        keys = ("0/1.txt", "0/sub/x.txt", "0/sub/y.txt")
        for key in keys:
            read_answer(answer_of(d, key))
            wait_kept(t, key)
        fd = os.open(t.path_for("0/1.txt"), os.O_RDONLY)  # an application reading it meanwhile
        d.invalidate("0/1.txt")
        assert not os.path.exists(t.path_for("0/1.txt")) and not os.path.exists(t.compressed_path_for("0/1.txt"))
        assert os.pread(fd, 10**6, 0) == (root / "1.txt").read_bytes()  # an open descriptor keeps reading
        os.close(fd)
        d.invalidate("0/sub")  # a directory: everything under it
        assert not any(os.path.exists(t.path_for(k)) for k in keys)
        assert t.decoded.bytes == 0 and t.decoded.describe()["files"] == 0 and t.used == 0
        # the next open of an invalidated key is not served from a copy at all
        assert resolve(d, "0/1.txt")[0] == protocol.SLOT_PFS and resolve(d, "0/sub/x.txt")[0] == protocol.SLOT_PFS
    finally:
        d.close()


def test_mark_changed_and_a_dropped_copy_remove_the_decoded_file(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        t = d.tiers[0]
        for key in ("0/0.txt", "0/1.txt"):
            read_answer(answer_of(d, key))
            wait_kept(t, key)
        d.stager.mark_changed("0/0.txt")  # staging.validate: open found the source changed
        assert not os.path.exists(t.path_for("0/0.txt"))
        with d.stager.lock:  # dropped to make room (a hinted reader consumed it): not stale, but gone
            d.stager.drop_locked("0/1.txt")
        assert not os.path.exists(t.path_for("0/1.txt")) and t.decoded.bytes == 0
    finally:
        d.close()


def test_a_decode_racing_an_invalidation_never_publishes_the_old_bytes(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        t, key = d.tiers[0], "0/3.txt"
        resolve(d, key)  # staged and decoded: forget the kept file, keep the compressed copy
        wait_kept(t, key)
        t.decoded.drop(key)
        decode = t.codec.decode

        def decode_then_the_job_writes(path, size):
            data = decode(path, size)  # the old bytes are decoded ...
            d.invalidate(key)          # ... while the job writes the file
            return data

        t.codec.decode = decode_then_the_job_writes
        answer = resolve(d, key)  # this open began before the write: either bytes are right for it
        if answer[0] & protocol.ANSWER_FD:
            os.close(answer[1])
        time.sleep(0.2)
        assert not os.path.exists(t.path_for(key)) and not t.decoded.holds(key)
        assert resolve(d, key)[0] == protocol.SLOT_PFS
    finally:
        d.close()


def test_a_decode_that_starts_after_the_copy_was_dropped_reads_the_pfs(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        t, key = d.tiers[0], "0/2.txt"
        d.stager.ensure(key).result(timeout=10)
        served = []
        d.stager.invalidate(key)  # between the stager's answer and the inflate thread's start
        d.resolver._inflate(key, t, Outcome.ALREADY_STAGED, lambda answer, outcome: served.append((answer, outcome)))
        assert served == [((protocol.SLOT_PFS, ""), "pfs:dropped")]
        assert not os.path.exists(t.path_for(key))
    finally:
        d.close()


def test_the_set_is_pinned_when_full_and_trimmed_oldest_first_when_the_budget_shrinks(tmp_path):
    budget = [30]
    files = DecodedFiles(str(tmp_path), lambda: budget[0])
    for k in "abc":
        assert files.put(k, k.encode() * 10, INFO, files.token())
    assert not files.put("d", b"d" * 10, INFO, files.token())  # full: d is not kept, nothing evicted
    assert list(files._files) == ["a", "b", "c"] and files.refused == 1 and not os.path.exists(tmp_path / "d")
    budget[0] = 15  # the tier filled: its room shrank
    files.trim()
    assert list(files._files) == ["c"] and files.bytes == 10 and files.evicted == 2
    assert sorted(os.listdir(tmp_path)) == ["c"] and open(tmp_path / "c", "rb").read() == b"c" * 10
    assert not files.put("e", b"e" * 20, INFO, files.token())  # larger than the budget
    token = files.token()
    files.drop("f")  # invalidated while f was being decoded
    assert not files.put("f", b"f", INFO, token) and not os.path.exists(tmp_path / "f")
    files.close()
    assert files.bytes == 0 and os.listdir(tmp_path) == []


def test_the_memory_margin_is_asked_once_per_file_kept(tmp_path):
    asked = []
    files = DecodedFiles(str(tmp_path), lambda: 1 << 20, lambda size: asked.append(size) or size < 100)
    assert files.put("a/b", b"x" * 50, INFO, files.token()) and asked == [50]
    assert not files.put("a/c", b"x" * 200, INFO, files.token()) and files.refused == 1
    assert sorted(os.listdir(tmp_path / "a")) == ["b"]


def test_a_room_budget_shrinks_as_the_tier_fills(tmp_path):
    root = tmp_path / "pfs"
    root.mkdir()
    for i in range(6):
        (root / f"{i}.txt").write_bytes(compressible(20_000, i))
    snap = take_snapshot((str(root),))
    t = tier(tmp_path, 30_000)  # room for the frames; what they leave is the decoded budget
    stager = Stager(snap, [t], threads=1)
    keys = sorted(snap.files)
    stager.ensure(keys[0]).result(timeout=10)
    data = open(root / "0.txt", "rb").read()
    assert t.decoded.put(keys[0], data, INFO, t.decoded.token())
    for k in keys[1:]:
        stager.ensure(k).result(timeout=10)
    assert t.decoded.bytes + t.used <= t.capacity  # the tier never holds more than its capacity
    assert t.decoded.evicted == 1 and not os.path.exists(t.path_for(keys[0]))


def test_a_kept_tier_does_not_carry_decoded_files_over_and_adopts_a_leftover_as_a_raw_copy(tmp_path):
    d, root = compressed_daemon(tmp_path, keep=True)
    t = d.tiers[0]
    read_answer(answer_of(d, "0/0.txt"))
    wait_kept(t, "0/0.txt")
    path = t.path_for("0/0.txt")
    d.close()
    assert not os.path.exists(path)  # a kept tier keeps copies it accounts for, not decoded files
    # a daemon that died without closing leaves one: the next run adopts it as the raw copy it
    # is (the source's bytes, size and mtime), accounted in the tier's capacity
    d2, _ = compressed_daemon(tmp_path, keep=True)
    try:
        t2 = d2.tiers[0]
        os.makedirs(os.path.dirname(t2.path_for("0/1.txt")), exist_ok=True)
        with open(t2.path_for("0/1.txt"), "wb") as f:
            f.write((root / "1.txt").read_bytes())
        os.utime(t2.path_for("0/1.txt"), ns=(os.stat(root / "1.txt").st_mtime_ns,) * 2)
    finally:
        d2.close()  # knows nothing of that file: it stays, as after a crash
    d3, _ = compressed_daemon(tmp_path, keep=True)
    try:
        t3 = d3.tiers[0]
        assert d3.stager.where("0/1.txt") is t3 and not t3.is_compressed("0/1.txt")
        assert t3.used == t3.stored == t3.logical == SIZE and t3.decoded.bytes == 0
        assert resolve(d3, "0/1.txt") == (t3.slot, t3.path_for("0/1.txt"))
    finally:
        d3.close()


def test_threads_opening_one_compressed_file_all_get_its_bytes(tmp_path):
    d, root = compressed_daemon(tmp_path)
    try:
        want = (root / "sub" / "x.txt").read_bytes()
        got = []
        ts = [threading.Thread(target=lambda: got.append(read_answer(answer_of(d, "0/sub/x.txt")))) for _ in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert len(got) == 8 and all(g == want for g in got)
        wait_kept(d.tiers[0], "0/sub/x.txt")
        assert d.tiers[0].decoded.kept == 1 and open(d.tiers[0].path_for("0/sub/x.txt"), "rb").read() == want
    finally:
        d.close()

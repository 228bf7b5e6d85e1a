"""The daemon's C front door (monarch/frontdoor): misses copied and hits answered outside the
interpreter, with the Python stager's books, claims and policy intact.

Every test checks the bytes a client is pointed at against the source, and the PFS reads
with the emulated PFS's own counters where one is mounted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from monarch import frontdoor, index_layout, protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.server import NodeServer
from monarch.node.snapshot.snapshot import describe_rest
from monarch.routes import FileFacts, Route, route_of
from support.harness import NO_RESERVE, unix_connect as connect, make_bases

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")


def make_files(root: str, n: int, size: int = 4096) -> dict[str, str]:
    """n files under root/dNN/; their keys -> md5 of their bytes."""
    sums = {}
    for i in range(n):
        d = os.path.join(root, f"d{i % 7}")
        os.makedirs(d, exist_ok=True)
        data = os.urandom(size + i % 13)
        with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
            f.write(data)
        sums[f"0/d{i % 7}/f{i:05d}.bin"] = hashlib.md5(data).hexdigest()
    return sums


def fast_root(short_tmp: str) -> str:
    """A dataset root on tmpfs (removed with short_tmp) when there is one: no journal there
    to stall a read now and then, which three times in a row would rightly make the door
    take the source for a slow one and hand its misses to Python."""
    if os.path.isdir("/dev/shm"):
        return f"/dev/shm{short_tmp}/pfs"
    return os.path.join(short_tmp, "pfs")


@pytest.fixture
def daemon_on(short_tmp):
    """``start(root, policy=..., capacity=..., **staging)`` -> (daemon, server): served until teardown (no
    filesystem reserve: NO_RESERVE)."""
    running = []

    def start(root: str, policy: str = "on-access", capacity: str = "64MiB", threads: "int | str" = 2, extra: str = "",
              tier_path: str | None = None, serve: bool = True):
        cfg = os.path.join(short_tmp, f"c{len(running)}.yaml")
        with open(cfg, "w") as f:
            f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run{len(running)}"
tiers: [{{name: ram, path: "{tier_path or f'{short_tmp}/ram{len(running)}'}", capacity: {capacity}}}{extra}]
staging: {{policy: {policy}, threads: {threads}, resolve_timeout: 20, share: false}}
{NO_RESERVE}""")
        make_bases(cfg)
        daemon = NodeDaemon(load_config(cfg, env={"USER": "u"}), f"r{len(running)}")
        server = NodeServer(daemon, embedded=False)
        thread = threading.Thread(target=server.serve, daemon=True)
        if serve:  # else the caller starts it: start.serve(server)
            thread.start()
        running.append((daemon, server, thread))
        return daemon, server

    def serve_later(server) -> None:
        next(t for _, s, t in running if s is server).start()

    start.running = running
    start.serve = serve_later
    yield start
    for daemon, server, thread in running:
        server.request_stop()
        if thread.is_alive():
            thread.join(10)
        elif server.front_door is not None:  # never served: its door was never stopped by serve()
            server.front_door.stop()
        daemon.close()


def raise_fd_limit(want: int) -> None:
    """At least ``want`` descriptors more than this process has open now (skip if the hard
    limit is lower); left raised: the daemon's side of a test's connections closes lazily,
    so earlier tests may still hold hundreds."""
    import resource
    want += len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"needs {want} descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def ask_open(path: str, key: str) -> tuple[int, bytes]:
    with connect(path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
        while True:
            status, body = protocol.recv_answer(s)
            if status != protocol.STATUS_PENDING:
                return status, body


def md5_of(path: bytes) -> str:
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def wait_idle(daemon: NodeDaemon, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not daemon.stager.idle() and time.monotonic() < deadline:
        time.sleep(0.05)


def staged_all(daemon: NodeDaemon, files: int, timeout: float = 60) -> dict:
    """The daemon's stats once it has staged ``files`` files (or ``timeout`` passed) and is idle."""
    deadline = time.monotonic() + timeout
    while daemon.stats()["staging"]["files"] < files and time.monotonic() < deadline:
        time.sleep(0.05)
    wait_idle(daemon)
    return daemon.stats()


def test_misses_are_copied_by_the_door_with_the_sources_bytes_mtime_and_private_mode(short_tmp, daemon_on):
    root = fast_root(short_tmp)
    sums = make_files(root, 60)
    daemon, _ = daemon_on(root)
    for key, digest in sums.items():
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot, key
        assert path == os.fsencode(os.path.join(daemon.tiers[0].path, key))
        assert md5_of(path) == digest
        src = os.stat(os.path.join(root, key[2:]))
        st = os.stat(path)
        assert st.st_mtime_ns == src.st_mtime_ns and stat.S_IMODE(st.st_mode) & 0o077 == 0
    # each was listed, not stat'ed, by the walk: the door described it from the descriptor it copied from,
    # in the index the shim maps (its source's stat, its route the door's)
    with open(daemon.index_path, "rb") as f:
        index = f.read()
    for key in sums:
        src = os.stat(os.path.join(root, key[2:]))
        e = index_layout.index_lookup(index, protocol.key_bytes(key))
        assert (*e[:2], *e[3:7]) == (src.st_size, src.st_mtime_ns, src.st_ctime_ns, src.st_ino, src.st_dev,
                                     src.st_mode), key  # (the copy's read moved the atime since)
        assert not e[10] & protocol.INDEX_FLAG_UNDESCRIBED and published_route(index, key) is Route.DOOR
    stats = daemon.stats()
    total = sum(os.path.getsize(os.path.join(root, k[2:])) for k in sums)
    assert stats["front_door"]["copies"] == len(sums)  # not one went through Python...
    assert stats["staging"]["pfs_files_read"] == len(sums)  # ...and the books have every one
    assert stats["staging"]["pfs_bytes_read"] == total
    assert stats["staging"]["files"] == len(sums) and stats["resolves"]["staged"] == len(sums)
    assert daemon.tiers[0].used == total  # what was lent and not used went back to the tier
    # asked again: the door answers from its table, and the report counts those hits
    for key, digest in list(sums.items())[:10]:
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot and md5_of(path) == digest
    assert daemon.stats()["resolves"]["already_staged"] == 10


def published_route(index: bytes, key: str) -> Route | None:
    """The route the index publishes for ``key`` (its entry's flags: protocol.INDEX_ROUTE_MASK)."""
    bits = (index_layout.index_lookup(index, protocol.key_bytes(key))[10] & protocol.INDEX_ROUTE_MASK) >> protocol.INDEX_ROUTE_SHIFT
    return Route(bits - 1) if bits else None


def test_the_door_copies_the_files_the_index_routes_to_it_and_hands_over_the_rest(short_tmp, daemon_on):
    """Each file's route is published in the index the door reads (monarch/routes.py's route_of on
    the file's static facts and the node's): a small file's is the door's, a large one's the
    blocks'; a small file whose published route is another's is handed over, not copied."""
    root = fast_root(short_tmp)
    sums = make_files(root, 4)
    with open(os.path.join(root, "large.bin"), "wb") as f:
        f.truncate(64 << 20)  # sparse: its size routes it
    daemon, _ = daemon_on(root)
    describe_rest(daemon.snapshot, daemon.stager.routes)  # a listing-mode walk's files: described in one pass here
    with open(daemon.index_path, "rb") as f:
        index = f.read()
    node = dataclasses.replace(daemon.stager.node, door=True)
    for key in [*sums, "0/large.bin"]:
        size = os.path.getsize(os.path.join(root, key[2:]))
        assert published_route(index, key) == route_of(FileFacts(size=size), node), key
    assert {published_route(index, k) for k in sums} == {Route.DOOR} and published_route(index, "0/large.bin") is Route.BLOCKS
    door = daemon.door_link.front_door
    if door.index is None:
        pytest.skip("the door maps the index file (no C walk): its routes cannot be rewritten here")
    first, *rest = sorted(sums)
    e = index_layout.Index(bytes(door.index))
    at = e.stats_off + protocol.INDEX_ENTRY.size * (e.stat_slot(e.number(protocol.key_bytes(first))) - 1) + 80  # its stat's flags
    flags = int.from_bytes(door.index[at:at + 4], "little")
    door.index[at:at + 4] = ((flags & ~protocol.INDEX_ROUTE_MASK) | (Route.COPY + 1) << protocol.INDEX_ROUTE_SHIFT
                             ).to_bytes(4, "little")  # the wrong route, as a broken writer would publish it
    for key in [first, *rest]:
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot and md5_of(path) == sums[key]  # the same answers, the same bytes
    stats = daemon.stats()["front_door"]
    assert stats["copies"] == len(rest) and stats["handed_over_because"].get("not_small_file") == 1
    status, _ = ask_open(daemon.socket_path, "0/large.bin")  # handed over: answered by the block path
    assert status & protocol.ANSWER_BLOCKS and status & ~protocol.ANSWER_BLOCKS == daemon.tiers[0].slot
    assert daemon.stats()["front_door"]["handed_over_because"]["not_small_file"] == 2


def test_demands_racing_the_read_ahead_read_each_file_once(short_tmp, daemon_on, slow_pfs):
    src = os.path.join(short_tmp, "src")
    sums = make_files(src, 300)
    pfs = slow_pfs(src)  # no added latency: the door and the read-ahead both copy
    daemon, _ = daemon_on(pfs.mountpoint, policy="read-ahead", threads=4)
    keys = sorted(sums)
    errors = []

    def reader(order):
        for key in order:
            status, path = ask_open(daemon.socket_path, key)
            if status < protocol.FIRST_TIER_SLOT or md5_of(path) != sums[key]:
                errors.append((key, status))

    threads = [threading.Thread(target=reader, args=(keys[i::3] + keys[:i:3],)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(list(reversed(keys)),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wait_idle(daemon)
    assert not errors
    assert daemon.stats()["staging"]["pfs_files_read"] == len(keys)
    counted = pfs.counters()  # the emulated PFS's own count: every file opened and read once
    assert {path: per["opens"] for path, per in counted["files"].items()} == {k[2:]: 1 for k in keys}
    assert counted["bytes"] == sum(os.path.getsize(os.path.join(src, k[2:])) for k in keys)


def test_a_write_by_the_job_is_never_answered_from_a_door_copy(short_tmp, daemon_on):
    root = fast_root(short_tmp)
    sums = make_files(root, 10)
    daemon, _ = daemon_on(root)
    keys = sorted(sums)
    assert ask_open(daemon.socket_path, keys[0])[0] == daemon.tiers[0].slot  # the door copied it
    with open(os.path.join(root, keys[0][2:]), "r+b") as f:  # the job writes it (its shim says so)
        f.write(b"CHANGED!")
    with connect(daemon.socket_path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_INVALIDATE, keys[0].encode()))
        assert protocol.recv_answer(s)[0] == 0
    assert ask_open(daemon.socket_path, keys[0]) == (protocol.SLOT_PFS, b"")
    assert not os.path.exists(os.path.join(daemon.tiers[0].path, keys[0]))
    # from then on the door copies nothing (Python does, with its dirty-key checks)
    copies = daemon.stats()["front_door"]["copies"]
    status, path = ask_open(daemon.socket_path, keys[1])
    assert status == daemon.tiers[0].slot and md5_of(path) == sums[keys[1]]
    assert daemon.stats()["front_door"]["copies"] == copies


def test_a_file_changed_since_the_snapshot_is_not_copied(short_tmp, daemon_on):
    root = fast_root(short_tmp)
    sums = make_files(root, 5)
    daemon, _ = daemon_on(root)
    key, listed = sorted(sums)[:2]
    assert daemon.snapshot.files.get(key) is not None  # described (the walk lists; a describe pass, or an open, stats)
    for k in (key, listed):
        with open(os.path.join(root, k[2:]), "ab") as f:  # someone else, outside the job
            f.write(b"longer now")
    assert ask_open(daemon.socket_path, key) == (protocol.SLOT_PFS, b"")
    stats = daemon.stats()
    assert stats["front_door"]["handed_over_because"].get("copy_failed") == 1
    assert stats["staging"]["failures"] == {"changed_since_snapshot": 1}
    assert not os.path.exists(os.path.join(daemon.tiers[0].path, key))
    # a file only listed when it changed is described at its first open: staged as it is then
    status, path = ask_open(daemon.socket_path, listed)
    with open(os.path.join(root, listed[2:]), "rb") as f:
        assert status == daemon.tiers[0].slot and md5_of(path) == hashlib.md5(f.read()).hexdigest()


def test_a_slow_source_gets_more_copies_in_flight_not_pythons_threads(short_tmp, daemon_on, slow_pfs):
    """Over a source of 50 ms per open the door's read-ahead lane does not take the source for
    slow, stop copying misses or leave the rest to Python's threads: its measure of the source
    climbs while the latency stays flat. The emulated PFS itself sees far more than 8 opens at
    once within a second of the first, the lane copies every file, and nothing is handed over or
    left to Python for being slow."""
    src = os.path.join(short_tmp, "src")
    sums = make_files(src, 400, size=2048)
    pfs = slow_pfs(src, open_latency_ms=50)
    daemon, _ = daemon_on(pfs.mountpoint, policy="read-ahead", threads="auto")
    stats = staged_all(daemon, len(sums))
    counted = pfs.counters()
    within_a_second = max((peak for t, peak in counted["opening_peaks"] if t <= 1.0), default=0)
    assert within_a_second >= 32, (counted["opening_peaks"], stats["front_door"]["in_flight"])
    door = stats["front_door"]
    assert door["read_ahead"]["ended_because"] == "" and door["read_ahead"]["copies"] >= len(sums) - 20, door
    assert "not_copying" not in door["handed_over_because"], door
    assert door["in_flight"]["peak"] >= 32, door["in_flight"]
    assert stats["staging"]["files"] == len(sums) and counted["opens"] == len(sums)
    for key, digest in sums.items():
        assert md5_of(os.fsencode(os.path.join(daemon.tiers[0].path, key))) == digest


def test_misses_of_a_slow_source_are_all_copied_at_once(short_tmp, daemon_on, slow_pfs):
    """Demand first: 12 readers each miss a different file of a 50 ms source at the same
    time; the door's copiers copy them all at once (the worker that read a miss goes on
    accepting), none is handed to Python, each reader gets the source's bytes."""
    src = os.path.join(short_tmp, "src")
    sums = make_files(src, 48)
    pfs = slow_pfs(src, open_latency_ms=50)
    daemon, _ = daemon_on(pfs.mountpoint, threads="auto")
    keys = sorted(sums)
    assert ask_open(daemon.socket_path, keys[0])[0] == daemon.tiers[0].slot  # the door measures the source
    errors = []

    def reader(mine):
        for key in mine:
            status, path = ask_open(daemon.socket_path, key)
            if status != daemon.tiers[0].slot or md5_of(path) != sums[key]:
                errors.append((key, status))

    threads = [threading.Thread(target=reader, args=(keys[1 + i::12],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    door = daemon.stats()["front_door"]
    assert door["copies"] == len(keys) and door["handed_over"] == 0, door
    counted = pfs.counters()
    assert counted["opening_peak"] >= 10, counted["opening_peaks"]
    assert counted["opens"] == len(keys)


def test_room_lent_to_the_door_comes_back_when_the_stager_needs_it(short_tmp, daemon_on):
    root = fast_root(short_tmp)
    sums = make_files(root, 4, size=4096)
    big = os.path.join(root, "big.bin")
    with open(big, "wb") as f:
        f.write(os.urandom(700 << 10))  # too big for the door: Python copies it
    daemon, _ = daemon_on(root, capacity="1MiB")
    for key in sorted(sums):
        assert ask_open(daemon.socket_path, key)[0] == daemon.tiers[0].slot
    assert daemon.door_link.front_door.lease() > 0  # the door holds room it has not used
    status, path = ask_open(daemon.socket_path, "0/big.bin")
    assert status == daemon.tiers[0].slot and md5_of(path) == md5_of(os.fsencode(big))
    assert daemon.tiers[0].used <= daemon.tiers[0].capacity


def test_without_the_door_the_python_server_answers_alone(short_tmp, monkeypatch, daemon_on):
    monkeypatch.setenv(frontdoor.ENV_FRONT_DOOR, "0")
    root = fast_root(short_tmp)
    sums = make_files(root, 5)
    daemon, server = daemon_on(root)
    assert server.front_door is None
    for key, digest in sums.items():
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot and md5_of(path) == digest
    assert daemon.stats()["front_door"] is None


def test_a_copy_of_the_doors_drained_by_one_thread_is_never_copied_again_by_another(short_tmp, daemon_on):
    """The server's tick drains the door's copies while a stager thread claims the same
    key: the claim must find the copy in the books, not copy it a second time."""
    root = fast_root(short_tmp)
    sums = make_files(root, 3)
    daemon, server = daemon_on(root)
    key = sorted(sums)[0]
    door = daemon.door_link.front_door
    drained, real = threading.Event(), door.events

    def slow_events():  # the server thread, between taking the door's events and booking them
        got = real()
        if got and threading.current_thread() is not threading.main_thread() and not drained.is_set():
            drained.set()
            time.sleep(0.5)
        return got

    door.events = slow_events
    assert ask_open(daemon.socket_path, key)[0] == daemon.tiers[0].slot  # the door copied it
    assert drained.wait(5)  # the tick took its event and is not done with it
    tier = daemon.stager.ensure(key).result(10)  # a stager thread: claim, then the books
    assert tier is daemon.tiers[0]
    time.sleep(0.7)  # the tick has booked what it took
    stats = daemon.stats()["staging"]
    assert stats["pfs_files_read"] == 1 and stats["files"] == 1


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_tier_whose_filesystem_fills_stops_the_doors_copies(short_tmp, daemon_on):
    import subprocess
    root = fast_root(short_tmp)
    sums = make_files(root, 120, size=4096)
    small = os.path.join(short_tmp, "small")
    os.makedirs(small)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", small], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        # the configuration says 64 MiB; the filesystem holds about 40 of the files, and no reserve
        # (daemon_on's) stops the tier before it is full (room others took, past any reserve)
        daemon, _ = daemon_on(root, tier_path=small, extra=f', {{name: ssd, path: "{short_tmp}/ssd", capacity: 64MiB}}')
        for key, digest in sums.items():
            status, path = ask_open(daemon.socket_path, key)
            assert status >= protocol.FIRST_TIER_SLOT and md5_of(path) == digest, key
        stats = daemon.stats()
        ram, ssd = stats["tiers"][0], stats["tiers"][1]
        assert ram["stopped"] == "filesystem_full" and ram["files"] + ssd["files"] == len(sums)
        door = stats["front_door"]
        assert door["copies"] < len(sums)  # it stopped when the tier did: at once, in each of its threads
        assert door["failed_copies"] <= 4
        # each copy the door could not write was read again by the stager, and so was the one
        # the stager could not write (into the next tier)
        assert len(sums) <= stats["staging"]["pfs_files_read"] <= len(sums) + door["failed_copies"] + 1
    finally:
        for d, server, thread in list(daemon_on.running):
            server.request_stop()
            thread.join(10)
            d.close()
        daemon_on.running.clear()
        subprocess.run(["umount", "-l", small], capture_output=True)


def test_a_flood_of_silent_connections_does_not_stop_the_door(short_tmp, daemon_on):
    """More connections than the door keeps waiting for their request (PENDING_MAX): the
    rest, and those that stay silent, go to the Python server, which times them out; the
    door answers a real request meanwhile."""
    raise_fd_limit(2 * 1500 + 500)  # both ends live in this process (the daemon is in-process)
    root = fast_root(short_tmp)
    sums = make_files(root, 3)
    daemon, server = daemon_on(root)
    silent = []
    try:
        for _ in range(1500):
            silent.append(connect(daemon.socket_path))
        key = sorted(sums)[0]
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot and md5_of(path) == sums[key]
        deadline = time.monotonic() + 10
        while daemon.stats()["front_door"]["handed_over"] < 1500 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemon.stats()["front_door"]["handed_over"] >= 1500  # past the limit at once, the rest after 0.5 s
    finally:
        for s in silent:
            s.close()


def test_connections_python_does_not_take_are_bounded(short_tmp, daemon_on):
    """With the Python loop not taking what the door hands over (stuck, or a flood), the
    door keeps at most HANDED_MAX waiting and closes the rest at once (their shims read
    the PFS); once the loop runs, it answers those that waited."""
    limit = 4096  # front_door.c: HANDED_MAX
    extra = 50
    raise_fd_limit(2 * (limit + extra) + 500)
    root = fast_root(short_tmp)
    make_files(root, 1)
    daemon, server = daemon_on(root, serve=False)  # its loop not running yet
    clients = []
    try:
        request = protocol.encode_request(protocol.VERB_OPEN, b"0/not-in-the-dataset")
        for _ in range(limit + extra):
            s = connect(daemon.socket_path)
            s.sendall(request)
            clients.append(s)
        deadline = time.monotonic() + 20
        while server.front_door.counts()["closed_too_many"] < extra and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.front_door.counts()["closed_too_many"] == extra
        assert server.front_door.counts()["handed_over"] == limit
        daemon_on.serve(server)
        answered = closed = 0
        for s in clients:
            s.settimeout(20)
            head = s.recv(8)
            if not head:
                closed += 1
                continue
            assert protocol.ANSWER_HEADER.unpack(head)[0] == protocol.SLOT_PFS  # not in the snapshot
            answered += 1
        assert (answered, closed) == (limit, extra)
    finally:
        for s in clients:
            s.close()


def test_random_frames_never_take_the_door_down(short_tmp, daemon_on):
    """Fuzz: frames of random bytes, random lengths, cut short, sent in pieces or closed at
    once, from several threads. Each gets an answer or a close; the daemon goes on answering
    real requests with the right bytes."""
    import random
    import socket
    root = fast_root(short_tmp)
    sums = make_files(root, 20)
    daemon, server = daemon_on(root)
    keys = sorted(sums)
    rng = random.Random(1234)
    cases = []
    for _ in range(int(os.environ.get("MONARCH_FUZZ_CASES", "600"))):
        key = rng.choice(keys).encode()
        body = rng.choice([key, key[:rng.randrange(len(key))], os.urandom(rng.randrange(0, 64)),
                           b"0/" + os.urandom(rng.randrange(1, 40)), key + b"\0x", b"0/../" + key[2:]])
        verb = rng.choice([protocol.VERB_OPEN] * 4 + [rng.randrange(256)])
        if verb == protocol.VERB_STOP:  # a well-formed STOP would stop the daemon, as it should
            verb = protocol.VERB_OPEN
        head = protocol.REQUEST_HEADER.pack(verb, rng.choice([0, 0, 0, rng.randrange(256)]), 0,
                                            rng.choice([len(body)] * 3 + [rng.randrange(1 << 16)]))
        frame = head + body
        cut = rng.choice([len(frame)] * 3 + [rng.randrange(len(frame) + 1)])
        cases.append((frame[:cut], rng.random() < 0.3, rng.random() < 0.2))

    def run(chunk):
        for data, in_pieces, close_early in chunk:
            with connect(daemon.socket_path) as s:
                s.settimeout(10)
                try:
                    if in_pieces:
                        for i in range(0, len(data), 3):
                            s.sendall(data[i:i + 3])
                    else:
                        s.sendall(data)
                    if close_early:
                        continue
                    s.shutdown(socket.SHUT_WR)  # a request cut short is all the daemon gets
                    while s.recv(4096):
                        pass
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused and closed on us mid-send: an answer too

    threads = [threading.Thread(target=run, args=(cases[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    for key in keys:
        status, path = ask_open(daemon.socket_path, key)
        if daemon.stager.is_dirty(key):  # a random INVALIDATE of it got through: the PFS from now on
            assert status == protocol.SLOT_PFS
        else:
            assert status == daemon.tiers[0].slot and md5_of(path) == sums[key]
    assert daemon.stats()["front_door"]["handed_over"] > 0 and server.errors  # odd ones went to Python, refused


OUT_OF_DESCRIPTORS = r"""
import json, os, resource, socket, sys, time
from monarch import frontdoor
work = sys.argv[1]
path = os.path.join(work, "door.sock")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(64)
os.makedirs(os.path.join(work, "ram"))
door = frontdoor.FrontDoor(listener.fileno(), [work], {0: os.path.join(work, "ram")}, 0, workers=1)  # another
# worker could take the descriptor a refusal frees and accept the connection for real: right, but not this test
clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(5)]  # made while fds are free
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
fillers, got = [], []
before = time.process_time()
resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 1, hard))
while True:  # the holes below the limit filled too: no descriptor left to take
    try:
        fillers.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
for s in clients:
    s.settimeout(5)
    s.connect(path)
    try:
        got.append(s.recv(8).hex())
    except TimeoutError:
        got.append("timed out")
spent = time.process_time() - before
for fd in fillers:
    os.close(fd)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print(json.dumps({"got": got, "closed_too_many": door.counts()["closed_too_many"], "cpu": spent}))
door.stop()
"""


def test_out_of_descriptors_closes_at_once_and_does_not_spin(short_tmp):
    """With the process out of descriptors, a connection the door cannot accept is closed at
    once (its shim reads the PFS) with the spare descriptor the door holds back, and counted:
    not left in the backlog, the listening socket readable and the door's loop spinning
    (the old door spun until a descriptor came free, its client waiting all that time).
    A bare door in a process of its own: no other thread there opens or closes descriptors."""
    import json
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[3]),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS, short_tmp], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["got"] == [""] * 5, r  # closed: the shim reads the PFS
    assert r["closed_too_many"] == 5
    assert r["cpu"] < 0.5, r  # no thread spun on the listening socket


def test_the_read_ahead_copies_small_files_in_the_doors_own_lane(short_tmp, daemon_on):
    """Small files, even a million, are staged at the machine's copy rate: the door's C lane
    copies the small files ahead of the reader (no Python per file), the stager the large
    ones; every file once, into the books as background copies, with the source's bytes."""
    root = fast_root(short_tmp)
    sums = make_files(root, 400, size=1024)
    for i in range(2):  # larger than a door copy: the stager's
        data = os.urandom(300 << 10)
        with open(os.path.join(root, f"large{i}.bin"), "wb") as f:
            f.write(data)
        sums[f"0/large{i}.bin"] = hashlib.md5(data).hexdigest()
    daemon, _ = daemon_on(root, policy="read-ahead", threads=2)
    stats = staged_all(daemon, len(sums))
    lane = stats["front_door"]["read_ahead"]
    assert lane["running"] == 0 and lane["through"] == 402
    assert stats["front_door"]["copies"] == 0  # ahead of the reader, not for a miss
    # the walk ran before the door was attached here (a foreground snapshot): the stager's read-ahead
    # may have taken a few small files before the lane took over (and a preempted copy may make the
    # door take its source for a slow one and end the lane: then the stager takes the rest)
    assert lane["copies"] >= (300 if lane["ended_because"] == "" else 1)
    assert stats["staging"]["files"] == len(sums) and stats["staging"]["pfs_files_read"] == len(sums)
    assert stats["staging"]["background_copies"] == len(sums) and stats["staging"]["demand_copies"] == 0
    assert stats["staging"]["pfs_bytes_read"] == sum(os.path.getsize(os.path.join(root, k[2:])) for k in sums)
    for key, digest in sums.items():
        assert md5_of(os.fsencode(os.path.join(daemon.tiers[0].path, key))) == digest
    # in the books, each under its own key (the lane's copies booked by their index entries)
    assert len(daemon.stager.staged) == len(sums) and all(daemon.stager.where(k) is daemon.tiers[0] for k in sums)
    # asked for now: answered from the copies the lane made
    for key in list(sums)[:5]:
        status, path = ask_open(daemon.socket_path, key)
        assert status == daemon.tiers[0].slot and md5_of(path) == sums[key]


def test_the_lane_goes_on_into_the_next_tier_when_the_first_is_full(short_tmp, daemon_on):
    """The first tier holds a third of the small files: the door's lane copies on into the
    second (as the stager spills), rather than waiting for room and leaving the rest to
    Python; every file once from the PFS, each tier within its capacity."""
    root = fast_root(short_tmp)
    sums = make_files(root, 300, size=3000)
    ssd = os.path.join(short_tmp, "ssd0")
    daemon, _ = daemon_on(root, policy="read-ahead", capacity="512KiB",
                          extra=f', {{name: ssd, path: "{ssd}", capacity: 64MiB}}')
    stats = staged_all(daemon, len(sums))
    lane = stats["front_door"]["read_ahead"]
    assert lane["running"] == 0 and lane["ended_because"] == "", lane
    assert stats["staging"]["files"] == len(sums) and stats["staging"]["pfs_files_read"] == len(sums)
    ram, second = daemon.tiers
    held = {k: daemon.stager.where(k) for k in sums}
    assert {t.name for t in held.values()} == {"ram", "ssd"}, stats["front_door"]
    # the walk's thread may have staged some first: how many is the machine's timing (24 once
    # on a loaded CI run, at most 20 before); the lane's going on is the held tiers above
    assert lane["copies"] >= len(sums) // 2
    assert ram.room <= ram.capacity and second.room <= second.capacity
    for key, tier in held.items():
        assert md5_of(os.fsencode(os.path.join(tier.path, key))) == sums[key]


def test_a_low_descriptor_limit_bounds_the_copiers_not_the_copies(short_tmp, daemon_on, slow_pfs):
    """A node's soft descriptor limit is often 1,024 and a slow source's lane would keep 256
    copies in flight, each holding up to four descriptors: the door starts only as many copiers
    as the limit allows, and no copy fails for want of a descriptor (EMFILE)."""
    import resource
    src = os.path.join(short_tmp, "src")
    sums = make_files(src, 300, size=2048)
    pfs = slow_pfs(src, open_latency_ms=50)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 300, hard))
    try:
        daemon, _ = daemon_on(pfs.mountpoint, policy="read-ahead", threads="auto")
        stats = staged_all(daemon, len(sums))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    door = stats["front_door"]
    assert door["failed_copies"] == 0 and door["read_ahead"]["ended_because"] == "", door
    assert door["in_flight"]["peak"] <= (used + 300 - 256) // 4 + 1, door["in_flight"]
    assert stats["staging"]["files"] == len(sums) and pfs.counters()["opens"] == len(sums)
    for key, digest in sums.items():
        assert md5_of(os.fsencode(os.path.join(daemon.tiers[0].path, key))) == digest


def test_the_glibc_skip_says_why_the_front_door_is_not_checked():
    text = (Path(__file__).resolve().parents[3] / "tests" / "shim" / "test_glibc_compat.py").read_text()
    assert "the front door imports what it calls)" not in text
    assert "applies to the shim only: the front door is not an interposer" in text

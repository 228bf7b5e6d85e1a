"""The stager publishes events (StagerListener) and whoever keeps books beside it subscribes:
the front door's link (monarch/node/doorkeeper/door_link.py) and nothing the stager knows by name.
The stager's rooms (books, scheduling, copying) and the door do not import each other."""

from __future__ import annotations

import ast
import collections
import hashlib
import os
from pathlib import Path

import monarch
from monarch.config import TierConfig
from monarch.node.tiers.resources import allocated_size, allocation_unit
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.node.stage.stager import Stager, StagerListener
from monarch.node.tiers.tiers import Tier, write_all, write_atomically

PACKAGE = Path(monarch.__file__).parent
STAGER_ROOMS = sorted((PACKAGE / "node" / "stage").glob("stager*.py"))


class Recorder(StagerListener):
    def __init__(self):
        self.events: list[tuple] = []

    def published(self, key, tier):
        self.events.append(("published", key, tier.name))

    def dropped(self, key):
        self.events.append(("dropped", key))

    def written(self, key):
        self.events.append(("written", key))

    def claiming(self, key):
        self.events.append(("claiming", key))
        return False


def make_dataset(tmp_path, n=6, size=1000):
    root = tmp_path / "pfs"
    for i in range(n):
        d = root / f"d{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(os.urandom(size))
    return take_snapshot((str(root),))


def a_tier(tmp_path, capacity, name="t0"):
    (tmp_path / name).mkdir(exist_ok=True)
    return Tier.from_config(TierConfig(name, str(tmp_path / name), capacity, False), 2, "r1", 0, ())


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_a_listener_is_told_of_every_copy_published_claimed_written_and_dropped(tmp_path):
    snap = make_dataset(tmp_path)
    stager = Stager(snap, [a_tier(tmp_path, 10**6)], threads=2)
    first = sorted(snap.files)[0]
    stager.ensure(first).result(timeout=30)
    rec = Recorder()
    stager.subscribe(rec)  # the copy made before it subscribed is told first
    assert rec.events == [("published", first, "t0")]
    for key in sorted(snap.files)[1:]:
        stager.ensure(key).result(timeout=30)
    published = [e[1] for e in rec.events if e[0] == "published"]
    claimed = [e[1] for e in rec.events if e[0] == "claiming"]
    assert sorted(published) == sorted(snap.files) and len(published) == len(set(published))
    assert claimed == sorted(snap.files)[1:]  # claimed once before each copy, never twice
    rec.events.clear()
    assert stager.invalidate("0/d0") == 3
    assert rec.events[0] == ("written", "0/d0")  # before any copy goes
    assert sorted(e[1] for e in rec.events[1:] if e[0] == "dropped") == sorted(k for k in snap.files if k.startswith("0/d0/"))
    assert len(rec.events) == 4


class Lender(StagerListener):
    """Holds room of a tier, uncounted, like the front door's lease; gives it back when asked."""

    def __init__(self, tier, nbytes):
        self.tier, self.held, self.asked = tier, nbytes, 0
        assert tier.reserve(nbytes, counted=False)

    def room_wanted(self, tier):
        self.asked += 1
        if tier is not self.tier or not self.held:
            return False
        tier.release(self.held)
        self.held = 0
        return True


def test_room_lent_out_of_a_tier_comes_back_when_a_copy_wants_it(tmp_path):
    snap = make_dataset(tmp_path, n=3)
    room = allocated_size(1000, allocation_unit(str(tmp_path)))  # what a file of 1000 bytes takes
    tier = a_tier(tmp_path, 3 * room)
    stager = Stager(snap, [tier], threads=1)
    lender = Lender(tier, 3 * room - room // 2)  # only half a file's room left: no file of 1000 fits
    stager.subscribe(lender)
    for key in sorted(snap.files):
        assert stager.ensure(key).result(timeout=30) is tier
        assert sha(tier.path_for(key)) == sha(snap.source_path(key))
    assert lender.held == 0 and lender.asked >= 1
    assert tier.used == 3000 and stager.stats()["failures"] == {}


class Maker(StagerListener):
    """Copies a key itself when the stager claims it (as the front door does for small files)
    and enters the copy into the stager's books."""

    def __init__(self, stager):
        self.stager, self.made = stager, []

    def claiming(self, key):
        tier, info = self.stager.tiers[0], self.stager.snapshot.files[key]
        data = Path(self.stager.snapshot.source_path(key)).read_bytes()
        assert tier.reserve(info.size)  # the room its copy takes, kept
        write_atomically(tier.path_for(key), lambda fd: write_all(fd, data), info.mtime_ns, 0o600,
                         publish=lambda tmp, dest: os.replace(tmp, dest), root=tier.path)
        with self.stager.lock:
            self.stager.count_read_locked("pfs", 1, len(data))
            self.stager.enter_copy_locked(key, tier, info.size)
        self.made.append(key)
        return True


def test_a_copy_a_listener_made_first_is_used_and_never_read_again(tmp_path):
    snap = make_dataset(tmp_path, n=4)
    tier = a_tier(tmp_path, 10**6)
    stager = Stager(snap, [tier], threads=2)
    maker = Maker(stager)
    stager.subscribe(maker)
    reads = collections.Counter()
    real = stager.copier.read_pfs
    stager.copier.read_pfs = lambda key, out: (reads.update([key]), real(key, out))[1]
    for key in sorted(snap.files):
        assert stager.ensure(key).result(timeout=30) is tier
        assert sha(tier.path_for(key)) == sha(snap.source_path(key))
    assert maker.made == sorted(snap.files) and not reads  # the stager read nothing itself
    s = stager.stats()
    assert (s["files"], s["bytes"], s["pfs_files_read"], s["pfs_bytes_read"]) == (4, 4000, 4, 4000)
    assert tier.files == 4 and tier.used == 4000


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_stager_and_the_front_door_do_not_import_each_other():
    assert len(STAGER_ROOMS) >= 4  # stager, its books, scheduling, copying
    for room in STAGER_ROOMS:
        assert not {m for m in imports_of(room) if m.startswith("monarch.frontdoor")}, \
            f"{room.name} imports the front door: subscribe to the stager's events instead (door_link.py)"
    for path in (PACKAGE / "frontdoor").glob("*.py"):
        assert not {m for m in imports_of(path) if m.startswith("monarch.node")}, \
            f"frontdoor/{path.name} imports the node daemon's rooms"


def test_each_room_of_the_stager_is_small_and_says_its_one_job():
    for room in STAGER_ROOMS:
        lines = room.read_text().splitlines()
        assert len(lines) <= 600, f"{room.name}: {len(lines)} lines (at most ~600: split it by job)"
        assert lines[0].startswith('"""') and len(lines[0]) > 20, f"{room.name}: the first line says its job"


def test_no_prestage_in_the_code_outside_the_configs_renamed_words():
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if "prestage" in p.read_text() and p.parent.name != "config"]
    assert found == []

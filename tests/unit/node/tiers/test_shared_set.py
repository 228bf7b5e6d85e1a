"""A shared set's leases, ledger, claims and linger, between "jobs" that are processes or descriptors of this one."""

from __future__ import annotations

import json
import os
import time

import pytest

from monarch.node.tiers import shared_set
from monarch.node.tiers.shared_set import CONTROL, EXPIRY, SharedSet, drop_expired, drop_set, list_sets
from monarch.node.tiers.shared_tier import private_per_job

KiB = 1024


@pytest.fixture
def base(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "root").mkdir()
    return str(tmp_path / "base"), (str(tmp_path / "root"),)


def join(base, roots, run, capacity=100 * KiB, linger=0.0, wait=0.2) -> SharedSet:
    return SharedSet.join(base, roots, run, capacity, linger, wait)


def test_a_second_job_joins_the_first_ones_set_and_the_last_out_removes_it(base):
    b, roots = base
    first = join(b, roots, "a")
    second = join(b, roots, "b", capacity=7)  # another capacity: the set's wins
    assert second.path == first.path and second.others_at_join == 1 and second.capacity == 100 * KiB
    os.makedirs(os.path.join(first.path, "0", "d"))
    with open(os.path.join(first.path, "0", "d", "x.bin"), "wb") as f:
        f.write(b"x" * 10)
    assert first.leave() is None and os.path.isdir(first.path)  # the second still uses it
    assert second.others_live() == 0
    assert second.leave() is None and not os.path.exists(second.path)  # no linger: gone


def test_the_last_job_out_leaves_the_copies_for_the_linger_then_drop_expired_removes_them(base):
    b, roots = base
    s = join(b, roots, "a", linger=600)
    os.makedirs(os.path.join(s.path, "0"))
    with open(os.path.join(s.path, "0", "x.bin"), "wb") as f:
        f.write(b"x" * 10)
    assert s.take(4 * KiB)  # the room of the copy, as the stager takes it before writing
    left = s.leave()
    assert left == {"path": s.path, "bytes": 4 * KiB, "until": left["until"]} and left["until"] > time.time()
    parent = os.path.dirname(s.path)
    assert drop_expired(parent) == [] and os.path.isdir(s.path)  # not over yet
    with open(os.path.join(s.path, CONTROL, EXPIRY), "w") as f:
        json.dump({"until": time.time() - 1}, f)
    assert drop_expired(parent) == [s.path] and not os.path.exists(s.path)


def test_a_dead_jobs_lease_is_released_by_the_kernel_and_its_half_written_copy_removed(base):
    b, roots = base
    pid = os.fork()
    if pid == 0:  # a job that joins, starts a copy and dies without leaving
        s = join(b, roots, "dead")
        os.makedirs(os.path.join(s.path, "0"), exist_ok=True)
        with open(os.path.join(s.path, "0", ".monarch-tmp-0123"), "wb") as f:
            f.write(b"half")
        assert s.take(4 * KiB)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    alive = join(b, roots, "alive")
    assert alive.others_at_join == 0  # the dead one's lease was found unlocked
    assert os.listdir(os.path.join(alive.path, CONTROL, "leases")) == [f"alive-{os.getpid()}"]
    assert os.listdir(os.path.join(alive.path, "0")) == []  # its temporary file went
    assert alive.taken() == 0  # and the room it had reserved
    alive.leave()


def test_the_ledger_bounds_the_set_not_each_job(base):
    b, roots = base
    a, c = join(b, roots, "a", capacity=10 * KiB), join(b, roots, "c", capacity=10 * KiB)
    assert a.take(6 * KiB)
    assert not c.take(6 * KiB)  # 12 KiB would pass the set's capacity
    a.give(6 * KiB)
    assert c.take(6 * KiB) and a.taken() == 6 * KiB
    a.leave()
    c.leave()


def test_a_key_claimed_by_one_job_makes_another_wait_then_give_up_or_get_it(base):
    b, roots = base
    a, c = join(b, roots, "a"), join(b, roots, "c")
    with a.claim("0/x.bin") as held:
        assert held
        with c.claim("0/x.bin", wait=0.05) as other:
            assert other is False  # another job stages it: not copied twice
        assert c.claims_waited == 1 and c.claims_timed_out == 1
    with c.claim("0/x.bin", wait=0.05) as other:
        assert other is True
    a.leave()
    c.leave()


def test_drop_refuses_a_set_in_use_and_lists_it(base):
    b, roots = base
    s = join(b, roots, "a")
    (info,) = list_sets(os.path.dirname(s.path))
    assert info.kind == "shared" and info.jobs == 1 and info.until is None
    assert "in use by 1 running job" in drop_set(s.path)
    s.leave()


def test_a_per_job_tmp_under_slurm_job_container_is_found(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nJobContainerType=job_container/tmpfs\n")
    assert private_per_job("/tmp", {"SLURM_JOB_ID": "42", "SLURM_CONF": str(conf)})
    assert private_per_job("/dev/shm", {"SLURM_JOB_ID": "42", "SLURM_CONF": str(conf)})
    assert not private_per_job("/tmp", {"SLURM_CONF": str(conf)})  # not in a job
    conf.write_text("JobContainerType=job_container/none\n")
    assert not private_per_job("/tmp", {"SLURM_JOB_ID": "42", "SLURM_CONF": str(conf)})


def test_claims_spread_keys_over_a_fixed_number_of_files(base):
    b, roots = base
    s = join(b, roots, "a")
    for i in range(50):
        with s.claim(f"0/{i}.bin"):
            pass
    names = os.listdir(os.path.join(s.path, CONTROL, "claims"))
    assert 1 < len(names) <= 50 and all(0 <= int(n) < shared_set.CLAIM_STRIPES for n in names)
    s.leave()


def test_a_job_of_the_same_dataset_joins_a_set_past_its_linger_and_another_such_set_goes(base, tmp_path):
    from monarch.config import TierConfig
    from monarch.node.tiers.shared_tier import SharedTier
    b, roots = base
    (tmp_path / "other").mkdir()
    for r in (roots, (str(tmp_path / "other"),)):
        s = join(b, r, "earlier", linger=600)
        os.makedirs(os.path.join(s.path, "0"))
        with open(os.path.join(s.path, "0", "x.bin"), "wb") as f:
            f.write(b"x")
        assert s.take(4 * KiB)
        s.leave()
        with open(os.path.join(s.path, CONTROL, EXPIRY), "w") as f:
            json.dump({"until": time.time() - 1}, f)
    tier = SharedTier.from_config(TierConfig("ram", b, 1 << 20), 2, "later", 0, roots, linger=600)
    assert os.path.exists(os.path.join(tier.path, "0", "x.bin"))  # its own dataset's copies: joined, warm
    (left,) = list_sets(os.path.dirname(tier.path))  # the other dataset's expired set went
    assert left.path == tier.path and left.jobs == 1
    tier.remove()


def test_a_lone_jobs_door_copies_until_another_job_joins_and_then_never_again(base):
    import threading
    b, roots = base
    stopped = threading.Event()
    a = join(b, roots, "a", wait=30)
    assert a.copy_alone(stopped.set)  # alone: its door may copy without claims
    a.hold_copies()  # its own stager's copies do not wait for its own door
    c = join(b, roots, "c", wait=30)
    assert not c.copy_alone(lambda: None)  # not alone: its door never copies into the set
    c.hold_copies()  # returns once the lone job's door has stopped (its lock released)
    assert stopped.is_set()
    assert not a.copy_alone(stopped.set)  # stopped for good
    c.leave()
    a.leave()

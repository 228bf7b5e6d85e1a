"""The hinted order's entries and other nodes' files as the peer read-ahead is told them
(``peer_door_link.extend_order``): every key's entry, the remote ones counted, their bytes
from a sample's sizes."""

import random
from array import array

from monarch.node.doorkeeper.entry_owners import OWNER_NONE
from monarch.node.doorkeeper.peer_door_link import extend_order


def owners_remote(owners):
    return lambda at: owners[at] >= 0


def setup(n, own_every=4, sizes=None):
    keys = [f"0/f{i:05d}" for i in range(n)]
    position = {k: i for i, k in enumerate(keys)}.get
    owners = array("h", [OWNER_NONE if i % own_every == 0 else 1 + i % 3 for i in range(n)])
    sizes = sizes or [65536] * n
    looked = []

    def size_of(key):
        looked.append(key)
        return sizes[position(key)]

    return keys, position, owners, sizes, size_of, looked


def test_every_entry_is_appended_and_the_remote_ones_counted_exactly_when_sizes_are_alike():
    keys, position, owners, sizes, size_of, looked = setup(1200)
    order = array("I", [7])  # an order continued (HINT_MORE): appended after what is there
    remote, nbytes = extend_order(order, keys + ["0/not-in-the-snapshot"], position, owners_remote(owners), size_of)
    assert list(order) == [7] + [i + 1 for i in range(1200)]
    assert remote == 900 and nbytes == 900 * 65536
    assert 0 < len(looked) <= 64 + 1  # a sample's records, not every file's


def test_a_short_order_is_sized_whole_and_a_long_one_from_its_sample():
    rng = random.Random(5)
    sizes = [rng.randrange(1, 1 << 20) for _ in range(20000)]
    keys, position, owners, _, size_of, looked = setup(20000, sizes=sizes)
    remote, nbytes = extend_order(array("I"), keys[:40], position, owners_remote(owners), size_of)
    assert nbytes == sum(sizes[i] for i in range(40) if owners[i] >= 0) and len(looked) == remote
    looked.clear()
    remote, nbytes = extend_order(array("I"), keys, position, owners_remote(owners), size_of)
    exact = sum(s for s, o in zip(sizes, owners) if o >= 0)
    assert len(looked) <= 64 + 1 and abs(nbytes - exact) < 0.25 * exact


def test_remote_files_only_at_positions_a_stride_would_skip_are_still_sized():
    keys, position, owners, sizes, size_of, looked = setup(640, own_every=2)  # remote at odd positions only
    remote, nbytes = extend_order(array("I"), keys, position, owners_remote(owners), size_of)
    assert remote == 320 and nbytes == 320 * 65536 and looked

"""The table of who reads ahead: every mode has its row, each row is as written here (a changed
row fails), and for every node's facts the table answers what each lane's condition, written
out on its own below, says."""

from __future__ import annotations

import itertools

import pytest

from monarch.config.keys import POLICIES
from monarch.node.stage.read_ahead_modes import MODES, Lanes, Mode, Order, When, Where, decide

N, Y, C, K = When.NEVER, When.ALWAYS, When.C_DATA_PATH, When.COLLECTIVE
NONE, ALL, OWN = Order.NONE, Order.ALL, Order.OWN_FIRST

# copies misses, door copies, door's lane, walk to door, stager, streams, after the peer lane, store ahead
ROWS = {
    ("off", Where.ALONE): (N, N, N, N, NONE, N, N, N),
    ("off", Where.WALKING): (N, N, N, N, NONE, N, N, N),
    ("off", Where.REPLICATING): (N, N, N, N, NONE, N, N, N),
    ("off", Where.SHARDED): (N, N, N, N, NONE, N, N, N),
    ("on-access", Where.ALONE): (Y, Y, N, N, NONE, N, N, N),
    ("on-access", Where.WALKING): (Y, N, N, N, NONE, N, N, N),
    ("on-access", Where.REPLICATING): (Y, N, N, N, NONE, N, N, N),
    ("on-access", Where.SHARDED): (Y, C, N, N, NONE, N, N, N),
    ("read-ahead", Where.ALONE): (Y, Y, Y, N, ALL, Y, N, Y),
    ("read-ahead", Where.WALKING): (Y, N, N, C, OWN, K, N, N),
    ("read-ahead", Where.REPLICATING): (Y, N, N, N, OWN, K, N, N),
    ("read-ahead", Where.SHARDED): (Y, C, C, N, OWN, K, C, N),
}

FACTS = ("c_data_path", "collective", "door", "stores", "kept", "compressed")


def test_every_policy_has_a_row_wherever_the_node_stands():
    assert set(MODES) == set(itertools.product(POLICIES, Where))


@pytest.mark.parametrize("mode", sorted(ROWS, key=str), ids=lambda m: f"{m[0]}-{m[1].value}")
def test_each_row_is_as_written(mode):
    assert MODES[mode] == Mode(*ROWS[mode])


def test_a_changed_row_is_seen():
    changed = dict(MODES)
    changed[("on-access", Where.ALONE)] = Mode(*ROWS[("read-ahead", Where.ALONE)])
    assert [m for m in ROWS if changed[m] != Mode(*ROWS[m])] == [("on-access", Where.ALONE)]


def _conditions(policy: str, where: Where, f: dict) -> dict:
    """Each lane's condition, one by one, for a node standing ``where`` with the facts ``f``."""
    ahead = policy == "read-ahead"
    alone, sharded = where is Where.ALONE, where is Where.SHARDED
    # the peer lane needs a door, a peer cache (sharded) and the C data path; the read-ahead starts on its thread
    peer_lane = not alone and f["door"] and sharded and f["c_data_path"]
    return {
        "copies_misses": policy != "off",                                       # off: a miss reads the PFS
        # the door copies its own node's files, where it knows them; asked by the door (so there is one)
        "door_copies": (f["door"] and (alone or (sharded and f["c_data_path"])) and policy != "off"
                        and not f["stores"]),
        # the door's lane: asked alone, or on the peer lane's thread once the door knows the owners
        "door_lane": ahead and f["door"] and (alone or peer_lane),
        "stager": (ALL if alone else OWN) if ahead else NONE,
        "after_peer_lane": ahead and peer_lane,
        "store_ahead": ahead and alone,                      # a cluster's node reads only the keys it owns
        "reads_ahead": ahead,                                # and a lost node's files go ahead of the rest
        "codec_sample": ahead and f["compressed"],           # a compressing tier's sample goes first
    } | ({
        "streams": (alone or f["collective"]) and not f["kept"] and ahead,      # asked before the walk
    } if where in (Where.ALONE, Where.WALKING) else {}) | ({
        # asked during the shared walk (the layout is not decided)
        "walk_to_door": f["door"] and f["c_data_path"] and ahead and not f["stores"],
    } if where is Where.WALKING else {})


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("where", list(Where), ids=lambda w: w.value)
def test_the_table_answers_what_each_lanes_condition_says(policy, where):
    for values in itertools.product((False, True), repeat=len(FACTS)):
        facts = dict(zip(FACTS, values))
        if where is Where.ALONE and (facts["c_data_path"] or facts["collective"]):
            continue  # a cluster's facts
        lanes = decide(policy, where, **facts)
        expected = _conditions(policy, where, facts)
        assert {name: getattr(lanes, name) for name in expected} == expected, facts


def test_without_a_door_nothing_is_the_doors_and_the_stager_reads_ahead_alone():
    lanes = decide("read-ahead", Where.SHARDED, c_data_path=True, collective=True)
    assert not (lanes.door_copies or lanes.door_lane or lanes.after_peer_lane)
    assert lanes.stager is OWN and lanes.reads_ahead


def test_the_answer_is_a_plain_record():
    lanes = decide("read-ahead", Where.ALONE, door=True)
    assert lanes == Lanes(copies_misses=True, door_copies=True, door_lane=True, walk_to_door=False, stager=ALL,
                          streams=True, after_peer_lane=False, store_ahead=True, codec_sample=False)
    with pytest.raises(AttributeError):
        lanes.door_lane = False  # frozen

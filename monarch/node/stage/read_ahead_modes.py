"""Who reads ahead, by mode: one table from (staging.policy, where the node stands) to the lanes
that copy, and the plain record (``Lanes``) it answers for one node's facts.

A mode is a policy (``staging.policy``) and where the node stands (``Where``). Its row names, for
each lane, when it runs: always, never, or only with a fact of the node (the cluster's C data
path, a collective cluster). ``decide`` reads the row and the node's other facts, which hold
in every mode (``decide``'s rules), and answers a ``Lanes``. The daemon's parts ask it instead
of comparing policy strings: the resolver (does a miss stage at once), the front door (may it
copy, does its lane read ahead), the walk (does the read-ahead start on its first
directories), the read-ahead's start (which lanes, in what order), a store's set (fetch its
values ahead), a cluster's role (stage a lost node's files ahead).

The lanes, from the front (the application's open) to the back (the read-ahead):

=====================  ========================================================================
``copies_misses``      a miss is staged at once (the stager, or the door), else read from the PFS
``door_copies``        the C front door copies a miss from the PFS itself (``DoorLink.may_copy``
                       adds: a raw first tier, not shared with a job that joined)
``door_lane``          the door's C lane is asked to read the small files ahead (the stager the
                       large ones, and the rest if the lane ends early); it runs only where the
                       door copies (``DoorKeeper.read_ahead`` asks ``DoorLink.may_copy``)
``walk_to_door``       a cluster's shared walk leaves the small files of its first seconds to the
                       door's lane (``peer/cluster_role.py``'s ``DOOR_WALK_GRACE``)
``stager``             the stager reads ahead, in this order (``Order``); beside the door's lane,
                       the large files
``streams``            the read-ahead starts on the walk's files as it finds them (asked before
                       the walk: alone, or walking; a cluster's later rows keep its answer)
``after_peer_lane``    the read-ahead starts on the peer lane's thread, once the door knows who
                       owns each file (without that lane: here, by the stager alone)
``store_ahead``        a key-value store's values are fetched ahead, in the read-ahead's order
=====================  ========================================================================

Why each row is so:

- ``off``: only kept copies are served; nothing is copied, by anyone, wherever the node stands.
- ``on-access``: a miss is staged when it is opened, and nothing ahead of it. The door copies
  misses where it can tell a file is this node's to copy: alone (every file is), or sharded
  with the C data path (the peer lane tells it the owners). Replicating, the stager fetches
  other nodes' files from their owners first, which the door cannot; during the walk nothing
  is decided.
- ``read-ahead``, alone: every lane. The door's lane copies the small files (no interpreter
  per file), the stager the large ones, both from the walk's first directories; a store's
  values are fetched ahead in the same order.
- ``read-ahead``, walking: a cluster node during node 0's walk, its layout not decided. A
  collective cluster streams the walk, and each node stages what it will surely own; with the
  C data path the small files of the walk's first seconds wait for the door's lane (sharded,
  it takes them; replicating, the stager does, after the walk). A store is read only for the
  keys each node owns (the stager's schedule): never fetched ahead.
- ``read-ahead``, replicating: every node holds every file: the stager reads this node's own
  files first (from the PFS), then the others' (from their owners). The door does not copy.
- ``read-ahead``, sharded: the stager reads this node's own files (then the second copies of
  ``peer.replicas: 2``). With the C data path the door's lane copies the small ones, started
  on the peer lane's thread once the door knows the owners.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Where", "When", "Order", "Mode", "Lanes", "MODES", "decide"]


class Where(enum.Enum):
    """Where a node stands, as far as the read-ahead cares (a cluster's placement of files is
    ``monarch/cluster/``'s)."""

    ALONE = "alone"              # one daemon on the node, no cluster
    WALKING = "walking"          # a cluster's node while node 0's walk is shared: its layout not decided yet
    REPLICATING = "replicating"  # a cluster's node holding every file (or owning by hashing: no capacities)
    SHARDED = "sharded"          # a cluster's node holding its own share; other nodes' files from their owners


class When(enum.Enum):
    """When a lane of a row runs."""

    NEVER = "never"
    ALWAYS = "always"
    C_DATA_PATH = "with the C data path"  # the cluster's C data path is there (cluster.datapath)
    COLLECTIVE = "collective"             # the cluster's nodes run collectives (node 0's walk streamed)


class Order(enum.Enum):
    """What the stager reads ahead, in what order."""

    NONE = "none"            # nothing: files are staged as they are opened (or not at all)
    ALL = "all"              # every file, in the snapshot's order
    OWN_FIRST = "own first"  # this node's own files first; replicating, the others' next; then second copies


@dataclass(frozen=True)
class Mode:
    """One row of the table: when each lane runs (``Lanes`` names them)."""

    copies_misses: When
    door_copies: When
    door_lane: When
    walk_to_door: When
    stager: Order
    streams: When
    after_peer_lane: When
    store_ahead: When


@dataclass(frozen=True)
class Lanes:
    """Who does what on one node, its facts applied (the module's docstring names each lane)."""

    copies_misses: bool
    door_copies: bool
    door_lane: bool
    walk_to_door: bool
    stager: Order
    streams: bool
    after_peer_lane: bool
    store_ahead: bool
    codec_sample: bool  # the read-ahead stages the compressing tiers' sample first (their level chosen on it)

    @property
    def reads_ahead(self) -> bool:
        """Does anything read ahead of the application? (The stager always has a part.)"""
        return self.stager is not Order.NONE


# the table's cells, short: never, yes (always), with the C data path, in a collective cluster
N, Y, C, K = When.NEVER, When.ALWAYS, When.C_DATA_PATH, When.COLLECTIVE
ALONE, WALKING, REPLICATING, SHARDED = Where.ALONE, Where.WALKING, Where.REPLICATING, Where.SHARDED

MODES: dict[tuple[str, Where], Mode] = {
    # policy      where               copies  door    door's  walk to  stager           streams   after the  store
    #                                 misses  copies  lane    door                      the walk  peer lane  ahead
    ("off",        ALONE):       Mode(N,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("off",        WALKING):     Mode(N,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("off",        REPLICATING): Mode(N,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("off",        SHARDED):     Mode(N,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("on-access",  ALONE):       Mode(Y,      Y,      N,      N,       Order.NONE,      N,        N,         N),
    ("on-access",  WALKING):     Mode(Y,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("on-access",  REPLICATING): Mode(Y,      N,      N,      N,       Order.NONE,      N,        N,         N),
    ("on-access",  SHARDED):     Mode(Y,      C,      N,      N,       Order.NONE,      N,        N,         N),
    ("read-ahead", ALONE):       Mode(Y,      Y,      Y,      N,       Order.ALL,       Y,        N,         Y),
    ("read-ahead", WALKING):     Mode(Y,      N,      N,      C,       Order.OWN_FIRST, K,        N,         N),
    ("read-ahead", REPLICATING): Mode(Y,      N,      N,      N,       Order.OWN_FIRST, K,        N,         N),
    ("read-ahead", SHARDED):     Mode(Y,      C,      C,      N,       Order.OWN_FIRST, K,        C,         N),
}


def decide(policy: str, where: Where, *, c_data_path: bool = False, collective: bool = False,
           door: bool = False, stores: bool = False, kept: bool = False, compressed: bool = False) -> Lanes:
    """The lanes of ``policy`` where the node stands (``where``) for a node with these facts (a fact not given
    is absent): ``c_data_path``, ``collective`` (the cluster's), ``door`` (a front door runs),
    ``stores`` (a root of the dataset is a key-value store), ``kept`` (a tier keeps its copies
    for the next job), ``compressed`` (a tier compresses its copies). Rules of every mode:

    - no door, no door lane (nor a peer lane, which is the door's);
    - a store's file has no PFS path to copy from: the door copies none (the stager does);
    - a kept tier's copies are adopted only once the walk is whole: nothing streams;
    - a compressing tier chooses its level on a sample the read-ahead stages first."""
    mode = MODES[(policy, where)]  # the policy checked by the configuration (config/keys.py's POLICIES)

    def holds(when: When) -> bool:
        return {When.NEVER: False, When.ALWAYS: True, When.C_DATA_PATH: c_data_path,
                When.COLLECTIVE: collective}[when]
    reads_ahead = mode.stager is not Order.NONE
    return Lanes(
        copies_misses=holds(mode.copies_misses),
        door_copies=holds(mode.door_copies) and door and not stores,
        door_lane=holds(mode.door_lane) and door,  # its copies are the door's: DoorLink.may_copy says if it runs
        walk_to_door=holds(mode.walk_to_door) and door and not stores,  # no link to ask yet: the rule applied here
        stager=mode.stager,
        streams=holds(mode.streams) and not kept,
        after_peer_lane=holds(mode.after_peer_lane) and door,
        store_ahead=holds(mode.store_ahead),
        codec_sample=reads_ahead and compressed)

"""The peer plane: the node daemons of one job (one per node) as one cluster. This docstring
is its map: every piece of it, in whichever room it lives, and the way one remote open travels.
docs/cluster.md is the account for users and operators (placement, losses, figures).

MPI lives only in the daemons (``monarch serve`` under mpiexec/srun). Importing this package
does not import mpi4py; ``Cluster.from_world()`` does.

Here, ``monarch/cluster/`` (the floor ``cluster``: below ``node``, so it knows no stager and
no tier): the MPI between daemons, Python's protocol and the C data path.

=====================  ======================================================================
``peer.py``            ``Cluster``, the façade the daemon calls (one per daemon), and its threads
``world.py``           where this process sits in an MPI job, MPI's process-wide settings, the
                       daemons' launch lines
``engine.py``          the MPI progress engine: the one thread that makes Python's MPI calls
``control.py``         the control messages' verbs and their verb -> handler table
``collective.py``      node 0's snapshot to every node, every node's capacities to every node
``streamed.py``        node 0's walk streamed to every node as it goes
``capacity.py``        what each node can hold, and the layout: replicate or shard
``placement.py``       file -> node: rendezvous hashing, capacity-weighted bounded shares, each
                       key's preference list (owners after losses, replicas)
``ranges.py``          a large file's ranges -> nodes: bounded rendezvous hashing of its ranges
``early.py``           what a node may stage while node 0 still walks (keys it will surely own)
``fetch.py``           Python's protocol, the requester's side: a file from its owner, or a span
                       of a large file's blocks from its range's owner
``provide.py``         Python's protocol, the owner's side: peers' requests answered, in chunks
``transfer.py``        Python's protocol on the wire: header, chunks, refusal, cancel and drain
``liveness.py``        heartbeats, pings, nodes down and lost
``shutdown.py``        ``finish`` (every node's statistics to one), the goodbye before ``close``
``lost.py``            the report's section on lost nodes
``counters.py``        the transfer counters, files and bytes each way, failures by reason
``order.py``           the write-back's order across the nodes: every node's journal counts at
                       a write-back open, a publish held until every node applied up to them
``partner.py``         the write-back's copy on a partner node: each file and record held there
                       before its call returns; a lost node's drained there, in its order
``holdings.py``        the copies of earlier runs' writes each node keeps, told to the others as
                       they are kept (a restart's reads: node/kept_reads.py)
``drains.py``          ``monarch drain`` on every node at once: each drain's progress to the others
                       over MPI (what waits for what: writeback/across.py)
``tuning.py``          the plane's knobs, as its parts read them from the façade
``datapath.py``        the C data path driven from Python (ctypes), built against the loaded MPI
``native/datapath.h``  the data path's contract with Python and the front door: its answers,
                       limits, counters and function types, held by
                       tests/unit/cluster/test_datapath_header.py (on the floor below both)
``datapath.c``         the data path: staged files between daemons with no Python on either side;
                       on a communicator of its own, the owner's one thread answers requests,
                       a requester posts and polls its own
``datapath_offers.c``  its part: the keys this node may serve, and the owner's read of one
``datapath_answers.c`` its part: the owner's answers to the requests that came (a fault's pages first;
                       files' stats from the index its node publishes, ``dp_describe``)
=====================  ======================================================================

In the node daemon (the floor ``node``): this node's part in the cluster.

=====================================  ======================================================
``node/peer/cluster_role.py``          ``ClusterRole``: the layout, who owns what, the shared
                                       walk, serving peers (``provide``), replicas, losses
``node/peer/peer_cache.py``            ``PeerCache``: a sharded node's peer area, an evicting
                                       cache of other nodes' files (or a transient memfd)
``node/peer/block_peers.py``           ``BlockPeers``: the nodes as sources of a large file's
                                       blocks (its ranges' owners), for the block stager
``node/peer/offers.py``                ``Offers``: this node's raw staged copies offered to the
                                       data path (``dp_staged``, ``dp_forget``)
``node/doorkeeper/peer_door_link.py``  ``PeerDoorLink``: the door's peer lanes kept in step with
                                       peer cache's books; the hinted order handed to the door
``node/doorkeeper/entry_owners.py``    ``EntryOwners``: whose file each index entry is, as the
                                       door is told it (the placement's ring, else a table)
=====================================  ======================================================

In the front door (the floor ``frontdoor``): C parts of ``frontdoor/front_door.c``'s one
translation unit, which call the data path through the addresses Python hands them
(``front_door_peers``), typed in ``native/datapath.h``.

===================================  ========================================================
``frontdoor/door_owners.c``          whose file an entry is: a bit an entry from the placement's
                                     ring (XXH64, ``native/xxh64.h``), else Python's table
``frontdoor/door_peer.c``            the peer lane: a remote open queued by owner, fetched in
                                     batches, published in the peer area or a sealed memfd
                                     (the memfd rule: which remote files the area keeps)
``frontdoor/door_peer_ahead.c``      the peer read-ahead lane: its state, its ring of copies,
                                     its gathering of a hinted order's files by owner
``frontdoor/door_peer_lane.c``       that lane's thread (batches in flight, replies put in
                                     place) and what Python calls to drive it
===================================  ========================================================

Used by the plane, owned by their rooms: ``node/stage/sources.py`` (``PeerSource``: a peer as
a source the stager copies from, for the replicate layout, replicas and the peer cache);
``frontdoor/door_copies.c`` (the door's own copies offered to the data path on a sharded node);
``native/poll_pace.h`` (how long the data path's and the door's polling threads sleep);
``node/daemon.py`` (makes the role and the door's peer lane); ``config`` (the ``peer:`` keys);
``hints`` (the readers' order); ``cli`` and ``launch/slurm.py`` (``monarch serve``, the
daemons' step); ``plan`` (``Placement`` before the job). Tests: tests/unit/cluster/,
tests/unit/node/peer/, tests/unit/frontdoor/test_lane_*.py, tests/mpi/.

One remote open (a sharded cluster, a small file another node owns):

1. The shim probes its tiers, then the peer area (slot 1 of ``MONARCH_PROBE``): a copy there is
   opened as a plain file, no daemon asked.
2. A miss asks the daemon. A front door worker reads the OPEN (``frontdoor/door_loop.c``:
   ``try_open``), finds the key's index entry, its owner in the array ``PeerDoorLink`` gave
   the door, and queues it for that owner (``frontdoor/door_peer.c``: ``remote_open``); a
   worker fetches that owner's waiting opens as one batch (``run_owner``, ``fetch_batch``), as
   many batches at once as the owner's measure allows (``frontdoor/inflight.c``), on at most
   half the door's workers.
3. The batch is one request through the data path (``dp_post``, ``dp_test``, ``dp_take``; else
   ``dp_fetch_many`` or ``dp_fetch``; ``datapath.c``); the worker serves its other connections
   while the reply is due.
4. On the owner the data path's thread (``dp_main``: ``take_requests``, ``answer``) reads each
   file from its offers (``datapath_offers.c``: ``read_staged``, by a descriptor or mapping
   kept from the first read) and sends one reply: the bytes of each file offered raw at the
   size asked, DP_HANDED_BACK for the others. No Python runs on the owner.
5. Back on the requester, ``remote_done`` publishes each file in the peer area (a temporary
   name, renamed) or seals a memfd, answers the OPEN (a path, or the descriptor) and the opens
   parked on the key, and posts an event on the peer cache's books (Q_PEER), which
   ``PeerDoorLink.absorb`` books in the cache's LRU.
6. What the door does not take (a large file, no data path) or could not fetch (handed back,
   a failure, a lost owner) is handed over to Python: the resolver (``node/resolver.py``)
   asks ``ClusterRole.remote``, then ``PeerCache.resolve``,
   ``PeerSource.copy`` and ``Cluster.fetch`` (``fetch.py``): the data path once more for a small
   file (``datapath.py``: ``dp_fetch``), else Python's protocol (``transfer.py`` on the engine),
   which the owner's ``provide.py`` serves through ``ClusterRole.provide``: it stages the file
   first if need be and sends a compressed copy as stored. Whatever fails, the application
   reads the PFS.

A large file (the route table's ``BLOCKS``) is no node's alone: every node stages
it by blocks (``node/stage/blocks.py``), and each of its 16 MiB ranges has an owner
(``ranges.py``). A node reads its own ranges' blocks from the PFS first; another owner's block
it fetches from that owner (``("range", tag, key, offset, length)``, answered by the owner's
``BlockStager.serve_range``, which reads the block from the PFS first if it has not yet: once
for the whole cluster). A lost owner's ranges are a survivor's; a block no owner can send is
read from the PFS.

With a hinted order the peer read-ahead lane (``frontdoor/door_peer_ahead.c``,
``frontdoor/door_peer_lane.c``) fetches the order's other nodes' files ahead of the reader by
steps 3 to 5, so that step 1 finds them. Replicating (every node holds the whole dataset) there
is no peer cache and no door lane: each node's stager copies the other nodes' files into its
peer area, pinned, through ``PeerSource`` and ``Cluster.fetch`` as in step 6.
"""

from ..errors import FailureReason
from .peer import Cluster
from .placement import owner
from .world import abort_on_unhandled_exception, mpi_world_rank

__all__ = ["Cluster", "FailureReason", "owner", "mpi_world_rank", "abort_on_unhandled_exception"]

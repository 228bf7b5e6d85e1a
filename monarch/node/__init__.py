"""The node daemon, in rooms by subsystem; each room's ``__init__`` is its map.

Read from the bottom up: each room imports only itself and the rooms below it
(``tests/unit/test_structure.py`` holds the order).

=================  =========================================================================
``snapshot/``      the dataset as the job found it: the walk (Python and C), its files and
                   listings, the index the shim maps, PFS metadata paid once, the snapshot's
                   state and what waits for it (``gate``)
``tiers/``         node-local storage: the tiers and their accounts, compressed tiers,
                   what the node has (memory, disk), a run's tier removed in C
``stage/``         copying into the tiers: the stager, its books, schedule and copies,
                   where bytes come from (the PFS, a peer, a store), how many copies are in
                   flight, which tier holds each copy, what serves now (``current``)
``outcomes.py``    every answer to an OPEN, declared once
``stats.py``       what the node tells the report, gathered: the shim's counters, the size
                   classes (the record, ``NodeStats``, is ``monarch/records/node_stats.py``)
``peer/``          this node's part in a cluster: the layout and ownership, other nodes'
                   files (the peer cache), what the C data path may answer peers by itself
``doorkeeper/``    the front door's keeper (the door is C, ``monarch/frontdoor/``): its
                   life, and its books kept with the stager's and the peer cache's
``instance.py``    one live daemon instance per run directory
``resolver.py``    where an OPEN goes (a copy, a decoded or inflated copy, the PFS)
``notices.py``     the job's writes (INVALIDATE) and read order (HINT)
``kept_reads.py``  a restart's reads of what earlier runs published: this node's kept copy, a
                   peer's (the partner's first) over the peer plane, or the PFS
``writeback.py``   the job's writes under the write-back paths: the shim's calls answered from
                   its view, the drain to the PFS (the core: ``monarch/writeback/``)
``read_ahead.py``  this node's read-ahead: its facts, the row of the table of modes they pick
                   (``stage/read_ahead_modes.py``: who reads ahead), its lanes started
``daemon.py``      the daemon's life cycle: makes the rooms above, assembles their statistics
``server.py``      the socket's event loop, a verb -> handler table
=================  =========================================================================
"""

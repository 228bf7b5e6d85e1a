"""Monarch: hierarchical data staging for deep-learning training on HPC clusters.

The package's rooms stack like floors (``FLOORS``, read from the bottom up): a module imports
modules of monarch/ only from its own floor and the floors below it, never from one above;
what two floors both need lives on the lower one (``records/``, as ``wire/monarch_wire.h``
holds the wire for the shim and the door). ``tests/unit/test_structure.py`` holds the order.

=================  ===========================================================================
``errors``         one exception base and a few meaningful kinds
``sizes``          sizes as people write and read them
``environment``    every ``MONARCH_*`` environment variable, declared once
``topology``       where this process runs: its node, its run's identity, its user
``secure``         the one place that creates Monarch's directories and files
``protocol``       the shim's and the door's wire (its C half: ``wire/monarch_wire.h``)
``index_layout``   the snapshot index built and read in Python: the reference for its C readers
``routes``         how an open is served: the routes, their size thresholds, ``route_of``
``layout``         where one run keeps its things on a node
``native``         what the C libraries share, and how they are built
``records``        records the rooms above share: a node's statistics, the snapshot's files
``shim``           the LD_PRELOAD shim (C) and where its library is
``frontdoor``      the daemon's front door (C), driven from Python
``hints``          the order a training script tells the daemon its next epoch reads
``store``          a dataset kept in a key-value store or an S3 bucket
``config``         the configuration: keys declared once, loaded, checked, frozen
``writeback``      a job's writes drained to the PFS, complete and in order: journal, area, drain
``cluster``        the peer plane: placement, snapshot sharing, transfers over MPI
``report``         the access report, built from the nodes' statistics
``node``           the node daemon, in rooms of its own (``node/__init__.py`` is their map)
``launch``         ``monarch run``: the daemon seen from outside, the command under the shim
``plan``           ``monarch plan``: what a cluster will hold of a dataset, before the job
``tools``          what shows and measures Monarch, apart from the daemon's code: the demo,
                   the emulated PFS it runs on, a training-like reader (``tools/__init__.py``)
``cli``            the ``monarch`` command (``__main__``: ``python -m monarch``)
=================  ===========================================================================
"""

__version__ = "0.1.0"

# monarch/'s floors, lowest first: a room (a subpackage) or a module at monarch/'s top. A module
# of a floor imports modules of monarch/ only from its own floor and those below it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "sizes", "environment", "topology"),  # import nothing of monarch
    ("secure",),
    ("protocol", "index_layout", "routes", "layout", "native"),
    ("records",),
    ("shim", "frontdoor", "hints"),
    ("store",),
    ("config",),
    ("writeback",),            # a job's writes drained to the PFS in order: journal, area, drain
    ("cluster",),
    ("report",),
    ("node",),
    ("launch",),
    ("plan",),
    ("tools",),                # the demo and what it runs: the emulated PFS, the workload
    ("cli", "__main__"),       # the command line
)

"""Tools that show and measure Monarch, apart from the code that stages: the daemon, the shim
and the launcher never import them. ``monarch demo``, the tests and the benchmarks do.

=================  =========================================================================
``slowpfs.py``     an emulated slow PFS: a FUSE view of a directory with a latency per open,
                   no page cache, and counters of its own, read-only unless ``--writable``
                   (``python -m monarch.tools.slowpfs``; needs the ``demo`` extra, mfusepy)
``slowpfs_writes.py``  its writes, when writable: each done on the source directory, capped and
                   counted with the namespace operations in order
``slowpfs_generated.py``  its generated tree (``--generate N``): N files made by formula, nothing
                   stored, and the formula (sizes, bytes) that tests and benchmarks check against
``slowpfs_counters.py``  its books: the counters (totals, per file) and the bandwidth caps
``workload.py``    a training-like reader: makes a dataset with a manifest of digests, reads
                   it for shuffled epochs with forked workers and checks every byte
                   (``python -m monarch.tools.workload make|read``)
``demo.py``        ``monarch demo``: the workload over the slow PFS, read directly and then
                   under ``monarch run``, side by side
=================  =========================================================================

They stay in the installed package because ``monarch demo`` runs them where Monarch is
installed, without a source checkout. This package's ``__init__`` imports nothing, so that
``python -m monarch.tools.slowpfs`` starts no more than the emulated PFS needs.
"""

"""Node-local storage: where copies are kept, and their room.

- ``tiers``: a tier (a private directory with a capacity), its accounts, its decoded files
- ``codecs``: compressed tiers (zstd, the level and dictionary chosen), in-memory copies
- ``resources``: what the node has: memory and free space, read at start and while running
- ``shared_set``: one user's copies of one dataset shared by that user's jobs on the node: leases,
  the ledger of room, per-key claims, linger; listing and dropping them (``monarch cache``)
- ``shared_tier``: a tier on a shared set (room from the ledger, other jobs' copies booked as
  found), or why a tier stays private to the job
- ``remover`` (``remover.c``): a run's tier removed by a few threads in C, no symlink followed
"""

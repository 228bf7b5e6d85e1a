"""Node-local storage: where copies are kept, and their room.

- ``tiers``: a tier (a private directory with a capacity), its accounts, its decoded files
- ``codecs``: compressed tiers (zstd, the level and dictionary chosen), in-memory copies
- ``resources``: what the node has: memory and free space, read at start and while running
- ``remover`` (``remover.c``): a run's tier removed by a few threads in C, no symlink followed
"""

"""Staging: copies from their sources into the tiers.

- ``stager``: the stager's face: asking for a key, the job's writes, its threads
- ``stager_books``: what is staged where, in flight, counted; the events it publishes
- ``stager_schedule``: what to copy next (demand, hints, read-ahead) and room made for it
- ``read_ahead_modes``: who reads ahead (the door's lane, the stager, ...), one table of modes
- ``stager_copy``: one copy into the first tier with room, published atomically
- ``blocks``: large files staged by blocks: an open answered at once, what fits staged
- ``block_ranges``: a cluster's large file: other owners' blocks fetched from them, this node's served
- ``block_map``: a block copy and its map as files (their format; another job's copy in a shared set)
- ``read_pace``: how much the block stager asks of the PFS at once (a few ms of its measured rate)
- ``stager_recode``: a compressing tier's early files re-encoded at its chosen level
- ``staged_table``: which tier holds each staged file (one byte per file)
- ``sources``: where bytes come from: one interface, the PFS and a peer behind it
- ``store_source``: roots served from a key-value store: their snapshot, their source
- ``concurrency``: how many copies a Python lane keeps in flight (the front door's rule)
- ``current``: the snapshot and the stager that serve now, swapped together
"""

"""The dataset snapshot: what the job's dataset is, walked once.

- ``snapshot``: the snapshot (every file's key and ``stat``, every listing) from one walk,
  or a kept one (or ``monarch index``'s manifest) reused after validation; ``load_or_walk``
  takes the C walk when it can
- ``walker`` (``walker.c``, ``index_fill.c``): the walk in C, writing the index with no Python object
  per file, in listing mode (names and types, no stat per file) or describing every file
- ``indextable``: the snapshot's files read from its index in place (``IndexTable``)
- ``key_order``: its keys in the read-ahead's order and a sample spread over them, with no list
  of millions of keys
- ``index_file``: the index built in the file the shim will map (copied there by the kernel, or
  walked into it), published by a rename: the node holds it once
- ``from_list``: a manifest from a list of files the user already has (paths, sizes optional):
  no file stat'ed, no directory listed whole (a name it leaves out is the PFS's)
- ``index_command``: ``monarch index``, a manifest walked or from a list
- ``index_writer``: the index file (protocol.py, "Snapshot index") from a file table
  (the file table itself, ``FileInfo`` and ``DirInfo`` are ``monarch/records/filetable.py``)
- ``pfsmeta``: PFS metadata round trips paid once (directory descriptors, attributes)
- ``gate``: the snapshot's state (walking, ready, failed) and what waits for it
- ``listed``: a listing-mode snapshot after its index is published: its files described in one
  pass, a manifest served before its check checked, the files described kept for the next job
"""

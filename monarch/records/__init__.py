"""Records that rooms on different floors share, kept below all of them: a room that writes a
record and a room that reads it both import it from here, never one from the other (as
``monarch/wire/`` holds the wire header for the shim and the door).

- ``node_stats``: what one node tells the report (``NodeStats``) and the slices inside it: the
  daemon fills it (``monarch/node/stats.py``), the launcher, its progress line and the report
  read it
- ``filetable``: a file and a directory as the snapshot saw them (``FileInfo``, ``DirInfo``),
  files and listings kept compact (``FileTable``, ``Listing``): the walk writes them, a store's
  manifest describes its dataset in them (``monarch/store/manifest.py``)
"""

"""Write-back: a job's writes under the write-back paths land on the node and drain to the PFS,
published complete and in the job's order (the contract: docs/consistency.md, "Write-back").

- ``journal.py``: the job's write-back operations on a node, in order, appended and read back
  after a crash (each record checked);
- ``area.py``: where a run keeps its pending files and journal on a node, private, held by
  its live daemon, found again by ``monarch drain`` once that daemon is gone;
- ``view.py``: the job's view of its write-back paths (the PFS with its pending files and
  operations applied), each change journaled in the order the job made it;
- ``drain.py``: the operations applied to the PFS strictly in journal order, each file's bytes
  written to a temporary name beside it and renamed, so no file is ever seen short under its
  name; progress kept in the journal, so a drain resumed after a crash writes nothing twice;
- ``ahead.py``: what the drain makes ready before the job waits for it (``fsync: pfs``): each
  file's temporary made on the PFS at its open, the directories it works in kept open;
- ``orphans.py``: the areas of runs whose daemons are gone, drained and removed (or kept, and why):
  one path for ``monarch drain`` and the next ``monarch run`` on the node.
"""

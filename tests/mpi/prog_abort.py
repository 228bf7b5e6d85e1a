"""MPI program driven by test_cluster.py: rank 1 raises; the job must end, not hang."""

import time

from monarch.cluster import Cluster, abort_on_unhandled_exception

abort_on_unhandled_exception()
cluster = Cluster.from_world()
if cluster.node == 1:
    raise RuntimeError("deliberate failure on node 1")
time.sleep(120)          # the others would wait for node 1 for ever

"""This node's part in a cluster (``monarch/cluster/`` is the MPI between daemons).

- ``cluster_role``: the layout, who owns what, the shared walk, serving peers, replicas, losses
- ``peer_cache``: the peer area, an evicting cache of other nodes' files
- ``offers``: what the C data path may answer peers by itself (this node's raw copies)
"""

"""This node's part in a cluster. The peer plane's map, every piece of it in every room and the
way one remote open travels, is ``monarch/cluster/__init__.py``.

- ``cluster_role``: the layout, who owns what, the shared walk, serving peers, replicas, losses
- ``peer_cache``: the peer area, an evicting cache of other nodes' files
- ``block_peers``: the nodes as the sources of a large file's blocks (its ranges' owners)
- ``offers``: what the C data path may answer peers by itself (this node's raw copies)
"""

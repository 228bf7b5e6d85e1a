"""The front door (``monarch/frontdoor/``, C) beside the daemon's Python books.

- ``door_link``: the door's life (``DoorKeeper``) and its copies booked in the stager's books,
  subscribed to the stager's events
- ``peer_door_link``: the door's peer lane beside the peer cache: other nodes' files fetched
  without Python
"""

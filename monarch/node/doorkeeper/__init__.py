"""The daemon's keeper of the front door: the door itself is C (``FrontDoor``, ``monarch/frontdoor/``);
here are its life and the Python books kept one with its table.

- ``door_link``: the door's life (``DoorKeeper``) and its copies booked in the stager's books
  (``DoorLink``), subscribed to the stager's events
- ``peer_door_link``: the door's peer lane kept with the peer cache's books (``PeerDoorLink``):
  other nodes' files fetched without Python (a piece of the peer plane, whose map is
  ``monarch/cluster/__init__.py``)
- ``entry_owners``: whose file each index entry is, as the door is told it (the placement's ring,
  or a table by entry)
"""

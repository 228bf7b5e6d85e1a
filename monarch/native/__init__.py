"""What Monarch's C libraries share, and how they are built.

- ``monarch_native.h``: the export marker, the clock, CRC-32 (``protocol.key_hash``) and the
  snapshot index's look-up (``index_layout.index_lookup``), each defined once; included by the
  shim, the front door, the walker, the remover and the peer data path (the index's layout is
  the wire's: ``monarch/wire/monarch_wire.h``)
- ``build``: the builder of every library (``setup.py``'s ``LIBRARIES`` at install, a
  checkout's cache on first use), its source digest counting the shared headers;
  ``OptionalLibrary``, a library loaded on first use with its prototypes set
"""

"""The launcher side, ``monarch run``: a node daemon's life seen from outside (service: find or
start, attach, stop, serve, the report; forked: the embedded daemon forked from its launcher;
logs: every process's log lines), running the command under the shim (run), live progress,
the user's shared and kept copies on the node (cache: ``monarch cache ls`` and ``drop``), what
``monarch drain`` says (drained). Who
this process is (its node and run) is ``monarch/topology.py``, below every room that needs it."""

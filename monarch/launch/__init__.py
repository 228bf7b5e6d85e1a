"""The launcher side, ``monarch run``: who this process is (topology), a node daemon's life seen
from outside (service: find or start, attach, stop, serve, the report), running the command
under the shim (run), live progress."""

"""The launcher side, ``monarch run``: who this process is (topology), attaching to or
starting the node daemon and running the command under the shim (run), live progress."""

"""One live daemon instance per run directory (monarch/node/instance.py): a second one is
refused before it touches anything; a dead one's state is removed before the new one
publishes its own; the new one's files carry its own id."""

from __future__ import annotations

import os
import socket

import pytest

from monarch.errors import DaemonError
from monarch.node.instance import Instance


def test_a_second_live_instance_is_refused_and_touches_nothing(tmp_path):
    first = Instance(str(tmp_path))
    open(first.index_path, "wb").close()
    with pytest.raises(DaemonError, match="already serves"):
        Instance(str(tmp_path))
    assert os.path.exists(first.index_path)  # the live instance's index is still there
    first.release()


def test_a_dead_instances_state_is_removed_and_the_new_names_differ(tmp_path):
    dead = Instance(str(tmp_path))
    left = [dead.index_path, dead.counters_path, os.path.join(tmp_path, "index"),
            os.path.join(tmp_path, "counters"), os.path.join(tmp_path, "daemon.pid"),
            dead.index_path + ".tmp-0a1b"]
    for path in left:
        open(path, "wb").close()
    s = socket.socket(socket.AF_UNIX)
    s.bind(dead.socket_path)
    dead.publish_socket()
    s.close()
    wb = socket.socket(socket.AF_UNIX)  # the write-back calls' socket (node/writeback_door.py)
    wb.bind(dead.writeback_socket_path)
    wb.close()
    os.mkdir(os.path.join(tmp_path, "index-feed"))  # not a file Monarch makes: left alone
    kept = [os.path.join(tmp_path, n) for n in ("daemon.log", "report.json", ".monarch-run", "start.lock")]
    for path in kept:
        open(path, "wb").close()
    dead.release()  # as the kernel does for a killed daemon
    new = Instance(str(tmp_path))
    assert new.id != dead.id
    assert sorted(os.listdir(tmp_path)) == sorted(["daemon.lock", "index-feed", *map(os.path.basename, kept)])
    new.release()

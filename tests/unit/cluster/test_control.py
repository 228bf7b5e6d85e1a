"""The peers' control messages (monarch/cluster/control.py): their wire form, declared once, and
the verb -> handler table that routes each one to the part serving it."""

import logging

import pytest

from monarch.cluster.control import ControlTable, Verb, message


def test_control_messages_keep_their_wire_form():
    import pickle

    assert message(Verb.REQ, 16, "0/a") == ("req", 16, "0/a")
    assert pickle.dumps(message(Verb.PING)) == pickle.dumps(("ping",))  # plain strings on the wire
    assert message(Verb.RANGE, 16, "0/a", 1 << 20, 4096) == ("range", 16, "0/a", 1 << 20, 4096)
    assert {v.value for v in Verb} == {"req", "range", "cancel", "ping", "pong", "done", "stats", "release", "bye",
                                       "wb-ask", "wb-told", "wb-applied", "wb-data", "wb-record", "wb-held",
                                       "wb-replayed", "kept"}
    got, heard = [], []
    table = ControlTable(heard.append, {Verb.REQ: lambda src, tag, key: got.append((src, tag, key))})
    table.dispatch(3, ("req", 17, "0/b"))
    table.dispatch(2, ("unknown",))
    assert got == [(3, 17, "0/b")] and heard == [3, 2]


def test_a_verb_served_by_two_parts_is_refused_at_start():
    with pytest.raises(ValueError, match="'ping' has two handlers"):
        ControlTable(lambda src: None, {Verb.PING: lambda src: None}, {Verb.PING: lambda src: None})


def test_each_part_gets_its_own_verbs_with_the_messages_arguments(caplog):
    calls = []
    table = ControlTable(lambda src: calls.append(("heard", src)),
                         {Verb.PING: lambda src: calls.append(("ping", src))},
                         {Verb.STATS: lambda src, stats: calls.append(("stats", src, stats)),
                          Verb.CANCEL: lambda src, tag: calls.append(("cancel", src, tag))})
    table.dispatch(1, message(Verb.PING))
    table.dispatch(2, message(Verb.STATS, {"node": 2}))
    table.dispatch(3, message(Verb.CANCEL, 17))
    with caplog.at_level(logging.WARNING, logger="monarch.cluster.control"):
        table.dispatch(4, message(Verb.BYE))  # nobody serves it: said, and the sender still heard
    assert calls == [("heard", 1), ("ping", 1), ("heard", 2), ("stats", 2, {"node": 2}),
                     ("heard", 3), ("cancel", 3, 17), ("heard", 4)]
    assert "unknown control message 'bye' from node 4" in caplog.text
    assert str(Verb.REQ) == "req" and f"{Verb.DONE}" == "done"  # the verb as logged and sent

"""The report's section on lost nodes (monarch/cluster/lost.py): who was lost, when and why, what
the survivors did after, and the PFS figure marked a lower bound."""

from __future__ import annotations

from monarch.cluster.lost import PFS_NOTE, add_to_report, lost_section


def alive(node: int, after_loss: dict | None = None, at_loss: dict | None = None, now: dict | None = None) -> dict:
    return {"node": node, "peer": {"after_loss": after_loss or {}, **({"opened_from_at_loss": at_loss}
                                                                       if at_loss is not None else {})},
            "opened_from": now or {}}


def test_a_lost_node_is_named_with_when_and_why_and_a_silent_one_with_its_reason():
    nodes = [alive(0),
             {"node": 1, "missing": True, "reason": "did not finish",
              "lost": {"node": 1, "at": 12.5, "why": "proc failed"}},
             {"node": 2, "missing": True, "reason": "did not finish", "lost": None},
             None]  # nothing at all came from node 3
    section = lost_section(nodes)
    assert section["nodes"] == [{"node": 1, "at": 12.5, "why": "proc failed"},
                                {"node": 2, "at": None, "why": "did not finish"},
                                {"node": 3, "at": None, "why": "unknown"}]
    assert section["pfs_note"] == PFS_NOTE


def test_what_the_survivors_did_after_the_loss_is_summed_from_their_counters_then_and_now():
    nodes = [alive(0, {"files_received": 2, "bytes_received": 200},
                   at_loss={"pfs": {"opens": 10, "bytes": 1000}, "ram": {"opens": 5, "bytes": 50}},
                   now={"pfs": {"opens": 13, "bytes": 1600}, "ram": {"opens": 9, "bytes": 90}}),
             alive(1, {"files_received": 1, "bytes_received": 100, "files_sent": 4},
                   at_loss={}, now={"peer": {"opens": 3, "bytes": 300}}),
             alive(2, {"files_sent": 1}, at_loss=None, now={"pfs": {"opens": 99, "bytes": 9999}}),  # saw no loss
             {"node": 3, "missing": True, "reason": "no heartbeat",
              "lost": {"node": 3, "at": 1.0, "why": "no heartbeat"}}]
    after = lost_section(nodes)["after_loss"]
    assert after["peer"] == {"files_received": 3, "bytes_received": 300, "files_sent": 5}
    assert after["opens"] == {"pfs": 3, "ram": 4, "peer": 3}
    assert after["bytes"] == {"pfs": 600, "ram": 40, "peer": 300}


def test_the_pfs_figure_is_a_lower_bound_only_when_a_node_was_lost():
    report = add_to_report({"pfs": {"bytes": 10}}, [alive(0), alive(1)])
    assert report["lost"]["nodes"] == [] and report["lost"]["pfs_note"] is None
    assert report["pfs"] == {"bytes": 10, "lower_bound": False}
    report = add_to_report({"pfs": {"bytes": 10}}, [alive(0), None])
    assert report["pfs"] == {"bytes": 10, "lower_bound": True, "lower_bound_why": PFS_NOTE}
    assert add_to_report({}, [None])["lost"]["nodes"] == [{"node": 0, "at": None, "why": "unknown"}]

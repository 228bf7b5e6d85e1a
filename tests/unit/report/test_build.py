"""The report from hand-made node statistics: honest figures when some bytes were not counted."""

import io
import os
import stat
import json

import pytest

from monarch.errors import MonarchError
from monarch.records.node_stats import NodeStats
from monarch.report.build import SCHEMA, build_report, session_delta
from monarch.report.store import load_report
from monarch.report.text import print_report

MiB = 2**20


def node(opened_from, staged=10 * MiB, files=10, node_index=0):
    return {"node": node_index, "host": f"h{node_index}", "opened_from": opened_from,
            "staging": {"files": files, "bytes": staged, "pfs_files_read": files, "pfs_bytes_read": staged,
                        "failures": {}},
            "dataset": {"files": files, "bytes": 10 * MiB}, "peer": {}, "resolves": {}, "tiers": []}


def text(report):
    out = io.StringIO()
    print_report(report, out)
    return out.getvalue()


JOB = {"job_id": "j", "config": "c.yaml", "command": ["python", "train.py", "--name", "my run"],
       "exit_code": 0, "wall_seconds": 1.5}


def test_all_bytes_counted_is_exact():
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                            "ram": {"opens": 30, "bytes": 30 * MiB, "opens_uncounted": 0}})], JOB)
    assert r["schema"] == SCHEMA == "monarch.report/4"
    p = r["pfs"]
    assert (p["app_bytes"], p["total_bytes"], p["without_monarch_bytes"], p["saved_bytes"]) == \
        (0, 10 * MiB, 30 * MiB, 20 * MiB)
    assert p["saved_fraction"] == pytest.approx(2 / 3, abs=1e-4)
    assert p["lower_bounds"] == [] and p["opens_uncounted"] == 0
    t = text(r)
    assert "≥" not in t and "unknown" not in t
    assert "without Monarch (est.)  : 30.0 MiB" in t and "saved (est.)            : 20.0 MiB (66.7%)" in t


def test_an_mmap_only_reader_gets_ranges_never_unknown():
    # an mmap-only reader (lmdb, numpy mmap_mode, DALI, arrow): the shim saw 30 opens, no byte read,
    # and the lengths they mapped: what their page faults read is at most that
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0, "opens_stdio": 0, "mapped_bytes": 0},
                            "ram": {"opens": 30, "bytes": 0, "opens_uncounted": 30, "opens_stdio": 0,
                                    "mapped_bytes": 30 * MiB}})], JOB)
    p = r["pfs"]
    assert p["saved_bytes"] is None and p["saved_fraction"] is None
    assert p["without_monarch_bytes"] == 0 and p["at_most"] == {"without_monarch_bytes": 30 * MiB}
    assert p["app_bytes"] == 0  # no open read the PFS: that zero is exact
    assert p["total_bytes"] == 10 * MiB and "total_bytes" not in p["lower_bounds"]
    t = text(r)
    assert "unknown" not in t
    assert "without Monarch         : 0 B to 30.0 MiB" in t  # nothing estimated: nothing counted
    assert "ram                 30  0 B to 30.0 MiB                100.0%" in t
    assert "pfs                  0              0 B                  0.0%" in t
    assert "30 opens were read through mmap or stdio, whose reads the shim does not all see" in t
    assert "saved" not in t


def test_a_stdio_reader_prints_the_bytes_fread_delivered_as_a_lower_bound():
    # fopen + fread (DALI's dont_use_mmap): fread's bytes counted, stdio's own reads not (no bound)
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0, "opens_stdio": 0, "mapped_bytes": 0},
                            "ram": {"opens": 50, "bytes": 25 * MiB, "opens_uncounted": 50, "opens_stdio": 50,
                                    "mapped_bytes": 0}})], JOB)
    t = text(r)
    assert "unknown" not in t
    assert "ram                 50      ≥ 25.0 MiB                100.0%" in t
    assert r["pfs"]["at_most"] == {}


def test_a_pfs_read_through_mmap_is_a_range_that_holds_the_truth():
    # a tier too small under an mmap reader: the PFS opens' bytes are between what read() counted
    # and that plus the lengths mapped; the total adds what Monarch staged (exact)
    r = build_report([node({"pfs": {"opens": 20, "bytes": MiB, "opens_uncounted": 20, "opens_stdio": 0,
                                    "mapped_bytes": 20 * MiB},
                            "ram": {"opens": 10, "bytes": 0, "opens_uncounted": 10, "opens_stdio": 0,
                                    "mapped_bytes": 10 * MiB}}, staged=5 * MiB)], JOB)
    p = r["pfs"]
    assert p["app_bytes"] == MiB and p["at_most"]["app_bytes"] == 21 * MiB
    assert p["total_bytes"] == 6 * MiB and p["at_most"]["total_bytes"] == 26 * MiB
    assert p["reads_of_dataset"] == 0.6 and p["at_most"]["reads_of_dataset"] == 2.6
    t = text(r)
    assert "read by the application : 1.0 MiB to 21.0 MiB" in t
    assert "total                   : 6.0 MiB to 26.0 MiB = 0.60x to 2.60x the dataset" in t
    # node rows of a cluster say the same
    two = build_report([node(n["opened_from"], staged=5 * MiB, node_index=i) for i, n in enumerate([r["nodes"][0]] * 2)],
                       {"job_id": "j", "config": "c", "nodes": 2})
    rows = [line for line in text(two).splitlines() if line[:2] in ("0 ", "1 ")]
    assert rows == [f"{i}       1.0 MiB to 21.0 MiB  0 B to 10.0 MiB     5.0 MiB  6.0 MiB to 26.0 MiB" for i in (0, 1)]


def test_opens_sent_to_the_pfs_before_the_index_name_the_setting_that_waits_for_it():
    stats = node({"pfs": {"opens": 3, "bytes": 0}})
    stats["metadata"] = {"local": 0, "pfs": 2, "before_index": {"opens": 3, "metadata": 2}}
    stats["snapshot_ready_seconds"] = 2.3
    t = text(build_report([stats], JOB))
    assert ("start     : 3 opens and 2 stats went to the PFS before the index was ready (the walk took 2.3 s); "
            "MONARCH_SHIM_INDEX_WAIT_MS=3000 makes the shim wait for it (default 300 ms)") in t


def test_some_opens_uncounted_gives_lower_bounds():
    r = build_report([node({"pfs": {"opens": 4, "bytes": 1 * MiB, "opens_uncounted": 2},
                            "ram": {"opens": 26, "bytes": 20 * MiB, "opens_uncounted": 3}})], JOB)
    p = r["pfs"]
    assert p["lower_bounds"] == ["app_bytes", "reads_of_dataset", "saved_bytes", "total_bytes",
                                 "without_monarch_bytes"]
    assert p["without_monarch_bytes"] == 21 * MiB and p["saved_bytes"] == 10 * MiB
    assert p["saved_fraction"] is None and p["opens_uncounted"] == 5
    t = text(r)
    assert "read by the application : ≥ 1.0 MiB" in t
    assert "total                   : ≥ 11.0 MiB = at least 1.10x the dataset" in t
    assert "without Monarch (est.)  : ≥ 21.0 MiB" in t
    assert "saved (est.)            : ≥ 10.0 MiB\n" in t
    assert "5 opens were read through mmap or stdio" in t


def test_stdio_reads_counted_through_fread_give_a_positive_bound_not_a_negative_saving():
    """numpy's np.load: 60 opens of the tier, each also uncounted (a FILE made by
    fdopen), their fread bytes counted: a lower bound on the saving, never an exact loss."""
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                            "ram": {"opens": 60, "bytes": 24 * MiB, "opens_uncounted": 60}}, staged=8 * MiB)], JOB)
    p = r["pfs"]
    assert p["without_monarch_bytes"] == 24 * MiB and p["saved_bytes"] == 16 * MiB
    assert p["saved_fraction"] == pytest.approx(2 / 3, abs=1e-4)
    assert {"without_monarch_bytes", "saved_bytes", "saved_fraction"} <= set(p["lower_bounds"])
    assert "saved (est.)            : ≥ 16.0 MiB (≥ 66.7%)" in text(r)


def test_a_bound_on_the_saving_that_is_not_positive_is_not_printed():
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                            "ram": {"opens": 60, "bytes": MiB // 4, "opens_uncounted": 30}}, staged=8 * MiB)], JOB)
    p = r["pfs"]
    assert p["saved_bytes"] is None and p["saved_fraction"] is None
    assert "without_monarch_bytes" in p["lower_bounds"]
    t = text(r)
    assert "saved" not in t and "-" not in t.split("PFS traffic")[1].split("staged")[0]


def test_processes_with_the_shim_are_summed_and_printed():
    nodes = [node({"ram": {"opens": 1, "bytes": 1}}, node_index=i) | {"processes_with_shim": n}
             for i, n in enumerate((3, 2))]
    r = build_report(nodes, JOB)
    assert r["processes_with_shim"] == 5
    assert "shim      : active in 5 processes" in text(r)
    assert build_report([node({"ram": {"opens": 1, "bytes": 1}})], JOB)["processes_with_shim"] is None


def test_uncounted_only_on_the_pfs_keeps_saved_exact_and_app_bytes_a_lower_bound():
    # saved = bytes read from the tiers - bytes read to stage them: both counted
    r = build_report([node({"pfs": {"opens": 2, "bytes": 0, "opens_uncounted": 2},
                            "ram": {"opens": 28, "bytes": 28 * MiB, "opens_uncounted": 0}})], JOB)
    p = r["pfs"]
    assert p["app_bytes"] == 0 and p["saved_bytes"] == 18 * MiB
    assert "saved_bytes" not in p["lower_bounds"] and {"app_bytes", "total_bytes"} <= set(p["lower_bounds"])
    assert "read by the application : ≥ 0 B" in text(r)  # a shim of before mapped lengths: no upper bound


def test_opens_uncounted_sums_over_nodes_and_marks_node_cells():
    nodes = [node({"pfs": {"opens": 0, "bytes": 0}, "ram": {"opens": 5, "bytes": 5 * MiB}}, node_index=0),
             node({"pfs": {"opens": 0, "bytes": 0}, "ram": {"opens": 5, "bytes": 2 * MiB, "opens_uncounted": 2}},
                  node_index=1)]
    r = build_report(nodes, {"job_id": "j", "config": "c", "nodes": 2})
    assert r["opened_from"]["ram"] == {"opens": 10, "bytes": 7 * MiB, "opens_uncounted": 2}
    lines = text(r).splitlines()
    node_rows = [line for line in lines if line[:1] in "01" and "MiB" in line]
    assert "≥" not in node_rows[0] and "≥ 2.0 MiB" in node_rows[1]


def test_share_column_and_shell_quoted_command():
    r = build_report([node({"pfs": {"opens": 1, "bytes": 1 * MiB}, "ram": {"opens": 3, "bytes": 3 * MiB}})], JOB)
    t = text(r)
    assert "share of bytes read" in t
    assert "75.0%" in t and "25.0%" in t
    assert "command   : python train.py --name 'my run'  (exit 0, 1.50 s)" in t


def test_a_shim_without_uncounted_opens_keeps_the_caveat():
    r = build_report([node({"pfs": {"opens": 1, "bytes": 1 * MiB}, "ram": {"opens": 3, "bytes": 3 * MiB}})], JOB)
    assert "opens_uncounted" not in r["opened_from"]["ram"]  # opened_from carries what the shim counted, as it counted it
    assert "mmap and stdio reads count opens only" in text(r)


def test_load_report_reads_both_schemas_and_refuses_others(tmp_path):
    r = build_report([node({"pfs": {"opens": 1, "bytes": 1}})], JOB)
    old = dict(r, schema="monarch.report/1")
    old["pfs"] = {k: v for k, v in r["pfs"].items() if k not in ("opens_uncounted", "lower_bounds")}
    for name, rep in (("new", r), ("old", old)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rep))
        assert "Monarch access report" in text(load_report(str(path)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(r, schema="other/9")))
    with pytest.raises(MonarchError, match="not a Monarch report"):
        load_report(str(bad))


def test_metadata_counts_are_summed_and_printed():
    a = node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}}) | {"metadata": {"local": 900, "pfs": 7,
                                                                                       "off_roots": []}}
    b = node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}}, node_index=1) | {
        "metadata": {"local": 100, "pfs": 3, "off_roots": [0]}}
    r = build_report([a, b, None], {"job_id": "j"})
    assert r["schema"] == SCHEMA and r["metadata"] == {"local": 1000, "pfs": 10}
    out = io.StringIO()
    print_report(r, out)
    assert "metadata  : 1000 calls answered from the snapshot, 10 sent to the PFS" in out.getvalue()
    old = build_report([node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}})], {})  # a node without them
    assert old["metadata"] == {"local": 0, "pfs": 0}


def test_size_classes_say_where_each_class_is():
    from types import SimpleNamespace as NS

    from monarch.node.stats import size_classes
    files = {"0/a": NS(size=1000), "0/b": NS(size=200_000), "0/c": NS(size=5 << 20), "0/d": NS(size=40 << 20),
             "0/e": NS(size=64 << 10)}
    ram, ssd = NS(name="ram"), NS(name="ssd")
    rows = size_classes(files, {"0/a": ram, "0/b": ssd, "0/e": ram}, fetched={"0/c"})
    by = {r["class"]: r for r in rows}
    assert [r["class"] for r in rows] == ["<64KiB", "<1MiB", "<16MiB", ">=16MiB"]
    assert by["<64KiB"]["staged"] == {"ram": {"files": 1, "bytes": 1000}}
    assert by["<1MiB"]["files"] == 2 and by["<1MiB"]["staged"] == {"ram": {"files": 1, "bytes": 64 << 10},
                                                                    "ssd": {"files": 1, "bytes": 200_000}}
    assert by["<16MiB"]["peer"] == {"files": 1, "bytes": 5 << 20}
    assert by[">=16MiB"]["not_staged"] == {"files": 1, "bytes": 40 << 20}


def test_a_large_file_served_from_staged_blocks_is_by_blocks_not_not_staged():
    from types import SimpleNamespace as NS

    from monarch.node.stats import size_classes
    files = {"0/d": NS(size=40 << 20), "0/f": NS(size=20 << 20), "0/g": NS(size=30 << 20)}
    rows = size_classes(files, {"0/g": NS(name="ram")}, set(), by_blocks={"0/d": 12 << 20})
    n = node({"pfs": {"opens": 1, "bytes": 1}})
    n["size_classes"] = rows
    r = build_report([n], JOB)
    large = r["size_classes"][-1]
    assert large["by_blocks"] == {"files": 1, "bytes": 12 << 20, "of_bytes": 40 << 20}
    assert large["not_staged"] == {"files": 1, "bytes": 20 << 20}  # 0/f: nothing of it staged
    assert ">=16MiB          3    90.0 MiB  ram 1 (30.0 MiB), by blocks 1 (12.0 MiB of 40.0 MiB), not staged 1 " \
           "(20.0 MiB)" in text(r)


def test_tiers_and_size_classes_in_the_report_and_its_text():
    n = node({"pfs": {"opens": 1, "bytes": 1 * MiB}, "ram": {"opens": 3, "bytes": 3 * MiB}})
    n["tiers"] = [{"name": "ram", "capacity": 4 * MiB, "used": 3 * MiB, "files": 3, "full": None,
                   "refused": {"memory_margin": 7}, "stopped": "memory_margin"},
                  {"name": "ssd", "capacity": 8 * MiB, "used": 8 * MiB, "files": 6, "full": "ENOSPC after 8 bytes",
                   "refused": {"filesystem_full": 2}, "stopped": "filesystem_full"}]
    n["size_classes"] = [{"class": "<64KiB", "max_bytes": 65536, "files": 10, "bytes": 10 * MiB,
                          "staged": {"ram": {"files": 3, "bytes": 3 * MiB}}, "peer": {"files": 0, "bytes": 0},
                          "not_staged": {"files": 7, "bytes": 7 * MiB}}]
    r = build_report([n], JOB)
    assert r["tiers"][0]["refused"] == {"memory_margin": 7} and r["tiers"][0]["stopped"] == "memory_margin"
    assert r["tiers"][1]["stopped"] == "filesystem_full"
    assert r["size_classes"][0]["not_staged"] == {"files": 7, "bytes": 7 * MiB}
    t = text(r)
    assert "ram            3.0 MiB / 4.0 MiB (75%)            3  stopped at the node's memory margin (memory_margin); " \
           "refused memory_margin x7" in t
    assert "its filesystem is full" in t
    assert "<64KiB          10    10.0 MiB  ram 3 (3.0 MiB), not staged 7 (7.0 MiB)" in t


def test_a_tier_stopped_at_its_filesystem_reserve_says_how_much_it_left_free_and_why():
    n = node({"ram": {"opens": 200, "bytes": 200 * MiB}})
    n["tiers"] = [{"name": "ram", "capacity": 48 * MiB, "used": 47 * MiB, "files": 47, "full": None,
                   "refused": {"filesystem_reserve": 153}, "stopped": "filesystem_reserve",
                   "filesystem_reserve": 16 * MiB,
                   "filesystem_reserve_from": "25% of the 64.0 MiB of /dev/shm (filesystem_reserve)"}]
    r = build_report([n], JOB)
    assert r["tiers"][0]["stopped"] == "filesystem_reserve"
    assert r["nodes"][0]["tiers"][0]["filesystem_reserve"] == 16 * MiB
    lines = text(r).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("ram ") and "/ 48.0 MiB" in line)
    assert lines[row].endswith("stopped at its filesystem's reserve for the application (filesystem_reserve); "
                               "refused filesystem_reserve x153")
    assert lines[row + 1].strip() == ("left 16.0 MiB of its filesystem free for the application: "
                                      "25% of the 64.0 MiB of /dev/shm (filesystem_reserve)")


def test_a_tier_whose_filesystem_had_no_room_beside_the_reserve_says_it_could_take_no_file_and_the_key():
    """A host whose / is 252 GiB with 60 GiB free: the tiers there keep its 25%, 63 GiB, and take
    nothing, whether the tiers before took every file or a copy was refused; a tier that had room
    says nothing of it."""
    GiB = 1 << 30
    no_room = {"filesystem_reserve": 63 * GiB, "filesystem_free_at_start": 60 * GiB,
               "filesystem_reserve_from": "25% of the 252.0 GiB of / (filesystem_reserve)"}
    n = node({"ram": {"opens": 10, "bytes": 10 * MiB}})
    n["tiers"] = [{"name": "ram", "capacity": 4 * GiB, "used": 10 * MiB, "files": 10, "refused": {}, "stopped": None,
                   "filesystem_reserve": GiB, "filesystem_free_at_start": 20 * GiB, "filesystem_reserve_from": "x"},
                  {"name": "ssd", "capacity": 32 * GiB, "used": 0, "files": 0, "refused": {}, "stopped": None, **no_room},
                  {"name": "disk", "capacity": 32 * GiB, "used": 0, "files": 0, "refused": {"filesystem_reserve": 5},
                   "stopped": "filesystem_reserve", **no_room}]
    lines = text(build_report([n], JOB)).splitlines()
    said = ("could take no file: its filesystem had 60.0 GiB free when the daemon started, less than the 63.0 GiB it "
            "leaves free for the application: 25% of the 252.0 GiB of / (filesystem_reserve); a smaller "
            "filesystem_reserve (a size, a share, or 0) lets it take files")
    for name, state in (("ssd", "offered no file"), ("disk", "stopped at its filesystem's reserve")):
        row = next(i for i, line in enumerate(lines) if line.startswith(name + " "))
        assert state in lines[row] and lines[row + 1].strip() == said, lines
    assert sum("could take no file" in line for line in lines) == 2


def as_written_before_4(report, schema):
    """``report`` as a schema before /4 wrote it: ``sources`` for ``opened_from``, in the nodes too."""
    def old(d):
        return {("sources" if k == "opened_from" else k): v for k, v in d.items()}
    return old(report) | {"schema": schema, "nodes": [old(n) if n else n for n in report["nodes"]]}


def test_version_2_reports_still_print(tmp_path):
    r = build_report([node({"pfs": {"opens": 1, "bytes": 1}})], JOB)
    old = as_written_before_4({k: v for k, v in r.items() if k not in ("tiers", "size_classes", "timeline")},
                              "monarch.report/2")
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(old))
    t = text(load_report(str(path)))
    assert "Monarch access report" in t and "file size" not in t


def test_a_version_3_report_reads_and_prints_as_today_s(tmp_path):
    """/3 named the opens' slots ``sources``; /4 ``opened_from`` (``sources`` is where copies come from)."""
    a = node({"pfs": {"opens": 4, "bytes": 3 * MiB, "opens_uncounted": 1}, "ram": {"opens": 9, "bytes": 5 * MiB,
                                                                                  "opens_uncounted": 0}})
    r = build_report([a, None, node({"ram": {"opens": 1, "bytes": MiB, "opens_uncounted": 0}}, node_index=2)], JOB)
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(as_written_before_4(r, "monarch.report/3")))
    loaded = load_report(str(path))
    assert "sources" not in loaded and loaded["opened_from"]["ram"] == {"opens": 10, "bytes": 6 * MiB,
                                                                       "opens_uncounted": 0}
    assert [n and n["opened_from"]["ram"]["opens"] for n in loaded["nodes"]] == [9, None, 1]
    assert text(loaded) == text(r)


def test_peer_bytes_on_the_wire_are_summed_and_printed():
    peer = {"bytes_sent": 30 * MiB, "bytes_received": 30 * MiB, "wire_bytes_sent": 10 * MiB,
            "wire_bytes_received": 10 * MiB, "files_sent": 3, "files_received": 3}
    a = node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}}) | {"peer": peer}
    b = node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}}, node_index=1) | {"peer": peer}
    r = build_report([a, b], JOB)
    assert r["peer"]["wire_bytes_received"] == 20 * MiB and r["peer"]["bytes_received"] == 60 * MiB
    assert "received 60.0 MiB (20.0 MiB on the wire" in text(r)
    raw = build_report([node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}}) | {"peer": dict(
        peer, wire_bytes_received=30 * MiB)}], JOB)
    assert "on the wire" not in text(raw)


def test_the_report_is_readable_by_its_owner_only(tmp_path):
    from monarch.report.store import write_report
    old = os.umask(0o022)  # a usual umask: the mode must not depend on it
    try:
        path = tmp_path / "out" / "report.json"
        write_report(build_report([node({"pfs": {"opens": 1, "bytes": 1, "opens_uncounted": 0}})], JOB), str(path))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert load_report(str(path))["schema"] == SCHEMA
    finally:
        os.umask(old)


def test_a_node_s_stats_cross_the_wire_and_back_unchanged():
    """The daemon fills a NodeStats; the socket and MPI carry its dict; readers get it back."""
    built = NodeStats(node=1, host="h1", opened_from={"ram": {"opens": 3, "bytes": 30, "opens_uncounted": 0}},
                      staging={"files": 1, "bytes": 30, "pfs_files_read": 1, "pfs_bytes_read": 30, "failures": {}},
                      front_door=None, snapshot="reused")
    wire = built.to_dict() | {"requests_refused": {"bad_frame": 2}}  # the server adds its own counts
    assert "timeline" not in wire and "size_classes" not in wire and wire["front_door"] is None  # a brief REPORT
    back = NodeStats.from_dict(json.loads(json.dumps(wire)))
    assert back.extra == {"requests_refused": {"bad_frame": 2}} and back.opened_from["ram"]["opens"] == 3
    assert back.to_dict() == wire
    assert build_report([wire], JOB)["nodes"] == [wire] == build_report([back], JOB)["nodes"]
    assert NodeStats.from_wire({"missing": True}) is None and NodeStats.from_wire(None) is None


def test_a_session_s_report_holds_what_the_session_did():
    start = NodeStats.from_dict(node({"ram": {"opens": 10, "bytes": 100, "opens_uncounted": 0}}, files=4)
                                | {"resolves": {"staged": 3}})
    end = NodeStats.from_dict(node({"ram": {"opens": 25, "bytes": 400, "opens_uncounted": 1}}, files=9)
                              | {"resolves": {"staged": 5, "hints": 2}, "front_door": {"copies": 7}})
    delta = session_delta(end, NodeStats.from_dict(start.to_dict() | {"front_door": {"copies": 4}}))
    assert delta.opened_from["ram"] == {"opens": 15, "bytes": 300, "opens_uncounted": 1}
    assert delta.resolves == {"staged": 2, "hints": 2} and delta.staging["files"] == 5
    assert delta.front_door == {"copies": 3} and end.opened_from["ram"]["opens"] == 25  # the end is left as it was
    r = build_report([delta], JOB)
    assert r["nodes"][0]["session_only"] is True and r["opened_from"]["ram"]["opens"] == 15


def test_without_monarch_is_labelled_an_estimate_and_says_what_it_counts():
    """An h5py-like reader re-reads chunks: "without Monarch" counts each re-read as a PFS read,
    which a page cache would have absorbed. The figure (and the saving) says it is an estimate."""
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                            "ram": {"opens": 40, "bytes": 17 * MiB + MiB // 2, "opens_uncounted": 0}})], JOB)
    p = r["pfs"]
    assert p["estimated"] == ["saved_bytes", "saved_fraction", "without_monarch_bytes"]
    assert p["lower_bounds"] == [] and p["without_monarch_bytes"] == 17 * MiB + MiB // 2
    t = text(r)
    assert "without Monarch (est.)  : 17.5 MiB\n" in t
    assert "saved (est.)            : 7.5 MiB (42.9%)\n" in t
    assert "est.: as if every byte the command read had been read from the PFS; a page cache absorbs re-reads" in t
    assert "total                   : 10.0 MiB = 1.00x the dataset" in t  # counted: no label


def test_a_run_that_staged_the_dataset_but_read_little_prints_no_absurd_percentage():
    """Read-ahead staged 10 MiB, the command read 80 KiB: the saving is negative, in bytes with its
    reason, never "-12600%"."""
    r = build_report([node({"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                            "ram": {"opens": 1, "bytes": 80 * 1024, "opens_uncounted": 0}})], JOB)
    p = r["pfs"]
    assert p["saved_bytes"] == 80 * 1024 - 10 * MiB and p["saved_fraction"] is None
    t = text(r)
    saved = next(line for line in t.splitlines() if line.startswith("  saved"))
    assert "%" not in saved and "Monarch read more from the PFS than the command read" in saved
    nothing = build_report([node({"ram": {"opens": 0, "bytes": 0, "opens_uncounted": 0}})], JOB)
    assert nothing["pfs"]["saved_fraction"] is None
    assert "%" not in "".join(line for line in text(nothing).splitlines() if line.startswith("  saved"))


def test_readme_report_reference_says_which_figures_are_exact_estimated_or_bounds():
    """Every `pfs` figure has its row in docs/report.md's fields, and the "How exact" table puts
    each in its kind: the estimated ones (``pfs.estimated``) there and nowhere else."""
    from pathlib import Path
    from monarch.report.build import ESTIMATED
    readme = (Path(__file__).resolve().parents[3] / "docs" / "report.md").read_text()
    reference = readme.split("\n## Fields\n", 1)[1].split("\n## ", 1)[0]
    pfs = build_report([node({"ram": {"opens": 3, "bytes": 30 * MiB, "opens_uncounted": 0}})], JOB)["pfs"]
    for key in pfs:
        assert f"`pfs.{key}`" in reference, key
    kinds = {row.split(" | ")[0].lstrip("| "): row for row in reference.split("How exact each figure is:", 1)[1]
             .split("\n\n", 2)[1].splitlines()[2:]}
    assert set(kinds) == {"exact (counted)", "range (`A to B`), lower bound (`≥`)", "estimated (`est.`)", "sampled"}
    assert "`pfs.at_most`" in kinds["range (`A to B`), lower bound (`≥`)"]
    figures = set(pfs) - {"opens_uncounted", "lower_bounds", "at_most", "estimated", "dataset_bytes"}
    for key in figures:
        kind = "estimated (`est.`)" if key in ESTIMATED else "exact (counted)"
        assert f"`pfs.{key}`" in kinds[kind], key
        assert all(f"`pfs.{key}`" not in row for k, row in kinds.items() if k != kind), key


def test_a_clusters_block_figures_are_summed_and_said():
    """Each node's blocks from the PFS and from their ranges' owners, summed for the cluster."""
    nodes = []
    for k in range(2):
        n = node({"pfs": {"opens": 1, "bytes": 1}})
        n["staging"]["blocks"] = {"files": 1, "whole_files": 1, "partly_staged_files": 0, "partly_staged_bytes": 0,
                                  "partly_staged_of_bytes": 0, "blocks_staged": 64, "bytes_staged": 64 * MiB,
                                  "blocks_from_pfs": 32, "bytes_from_pfs": 32 * MiB, "blocks_from_peers": 32,
                                  "bytes_from_peers": 32 * MiB, "blocks_peer_failed": k}
        nodes.append(n)
    r = build_report(nodes, JOB)
    b = r["blocks"]
    assert (b["blocks_from_pfs"], b["blocks_from_peers"], b["blocks_peer_failed"]) == (64, 64, 1)
    assert "blocks staged from the PFS: 64 (64.0 MiB), from their owners: 64 (64.0 MiB); read from the PFS when " \
           "the owner could not send them: 1" in text(r)

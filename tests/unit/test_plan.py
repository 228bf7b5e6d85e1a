"""``monarch plan``: the capacity model by hand on small cases, and the placement's targets at 1,024 nodes."""

import json
import os
import subprocess
import sys

import pytest

from monarch.cli import main
from monarch.config import load_config
from monarch.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KiB = 1024


@pytest.fixture
def cfg(tmp_path):
    """A node of 400 KiB: ram 100 KiB, ssd 200 KiB, peer area 100 KiB."""
    for d in ("ram", "ssd", "peer"):
        (tmp_path / d).mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(f"""
tiers:
  - {{name: ram, path: {tmp_path}/ram, capacity: 100KiB}}
  - {{name: ssd, path: {tmp_path}/ssd, capacity: 200KiB}}
peer: {{path: {tmp_path}/peer, capacity: 100KiB}}
""")
    return str(path)


def plan(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_three_times_a_node_over_four_nodes_is_sharded_and_all_held(cfg, capsys):
    p = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "1200", "--file-size", "1KiB", "--pfs-rate", "100KiB/s")
    assert p["mode"] == "shard" and p["dataset"] == {"files": 1200, "bytes": 1200 * KiB}
    for node in p["per_node"]:  # 1/4 each: 300 KiB, ram first, then ssd
        assert node["owns"] == node["holds"] == 300 * KiB
        assert node["tiers"] == {"ram": 100 * KiB, "ssd": 200 * KiB, "peer": 0}
        assert node["owned_on_pfs"] == 0
    assert p["pfs_remainder"] == 0
    e = p["epoch"]  # a node reads 300 KiB: 1/4 its own, 3/4 from peers
    assert e["read_per_node"] == 300 * KiB
    assert e["mean_per_node"]["local"] == 75 * KiB and e["mean_per_node"]["peer"] == 225 * KiB
    assert e["mean_per_node"]["pfs"] == 0 and e["pfs_total"] == 0 and e["peer_total"] == 900 * KiB
    assert p["staging"]["pfs_bytes"] == 1200 * KiB and p["staging"]["seconds"] == 12.0
    r = p["replicas_cost"]  # a second copy: 300 KiB more per node, 100 KiB of room each
    assert r["second_copy_per_node"] == 300 * KiB and r["room_after_owned"] == 400 * KiB
    assert r["second_copy_fits"] is False
    assert p["placement"]["max_share_over_mean"] == 1.0 and p["placement"]["moved_on_loss"] == 0.25
    assert p["placement"]["restaged_on_loss"] == 0.25


def test_with_two_replicas_the_second_copies_take_the_room_left(cfg, capsys):
    p = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "1200", "--file-size", "1KiB", "--replicas", "2")
    for node in p["per_node"]:
        assert node["replicas"] == {"wanted": 300 * KiB, "kept": 100 * KiB}
        assert node["holds"] == 400 * KiB and node["tiers"] == {"ram": 100 * KiB, "ssd": 200 * KiB, "peer": 100 * KiB}
    assert p["replicas_cost"]["kept_fraction"] == pytest.approx(1 / 3)
    assert p["staging"]["peer_bytes"] == 400 * KiB  # second copies come from the owners, not the PFS
    assert p["placement"]["restaged_on_loss"] == pytest.approx(0.25 * 2 / 3)


def test_six_times_a_node_leaves_a_third_on_the_pfs(cfg, capsys):
    p = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "2400", "--file-size", "1KiB", "--replicas", "2")
    assert p["mode"] == "shard"
    for node in p["per_node"]:  # owns 600 KiB, holds its 400 KiB, no room for second copies
        assert node["owns"] == 600 * KiB and node["holds"] == 400 * KiB and node["owned_on_pfs"] == 200 * KiB
        assert node["tiers"] == {"ram": 100 * KiB, "ssd": 200 * KiB, "peer": 100 * KiB}
        assert node["replicas"]["kept"] == 0
    assert p["pfs_remainder"] == 800 * KiB
    m = p["epoch"]["mean_per_node"]  # reads 600 KiB: 400/2400 local, 800/2400 PFS, the rest peers
    assert (m["local"], m["pfs"], m["peer"]) == (100 * KiB, 200 * KiB, 300 * KiB)
    assert p["epoch"]["pfs_total"] == 800 * KiB and p["staging"]["pfs_bytes"] == 1600 * KiB


def test_a_dataset_that_fits_on_every_node_is_replicated(cfg, capsys):
    p = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "300", "--file-size", "1KiB")
    assert p["mode"] == "replicate" and "every node can hold" in p["why"]
    for node in p["per_node"]:
        assert node["holds"] == 300 * KiB and node["tiers"] == {"ram": 100 * KiB, "ssd": 200 * KiB, "peer": 0}
    assert p["epoch"]["mean_per_node"]["local"] == 75 * KiB and p["epoch"]["peer_total"] == 0
    assert p["staging"]["pfs_bytes"] == 300 * KiB and p["staging"]["peer_bytes"] == 900 * KiB
    assert p["placement"]["restaged_on_loss"] == 0
    s = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "300", "--file-size", "1KiB", "--shard")
    assert s["mode"] == "shard" and all(n["holds"] == 75 * KiB for n in s["per_node"])


def test_plan_walks_a_real_dataset_and_prints_text(cfg, tmp_path, capsys):
    ds = tmp_path / "ds"
    (ds / "a").mkdir(parents=True)
    for i in range(10):
        (ds / "a" / f"{i}.bin").write_bytes(b"x" * (1000 * (i + 1)))
    p = plan(capsys, "-c", cfg, "--nodes", "2", "--dataset", str(ds))
    assert p["dataset"] == {"files": 10, "bytes": 55_000}
    assert sum(n["owns"] for n in p["per_node"]) == 55_000
    assert main(["plan", "-c", cfg, "--nodes", "3", "--files", "5000", "--file-size", "1KiB"]) == 0
    out = capsys.readouterr().out
    assert "layout  : shard" in out and "node 2  :" in out and "re-owns" in out


@pytest.mark.parametrize("args, message", [
    (["--files", "10"], "together"),
    (["--files", "10", "--file-size", "ten"], "--file-size"),
    (["--files", "10", "--file-size", "1KiB", "--pfs-rate", "fast"], "--pfs-rate"),
    (["--files", "10", "--file-size", "1KiB", "--nodes", "0"], "--nodes"),
])
def test_plan_usage_errors(cfg, capsys, args, message):
    assert main(["plan", "-c", cfg, *args]) == 2
    assert message in capsys.readouterr().err


def test_peer_replicas_is_validated(cfg, tmp_path):
    assert load_config(cfg, check_roots=False, roots=["/x"]).peer.replicas == 1
    for value, ok in (("2", True), ("3", False), ("true", False), ("two", False)):
        path = tmp_path / f"r{value}.yaml"
        path.write_text(open(cfg).read().replace("peer: {", f"peer: {{replicas: {value}, "))
        if ok:
            assert load_config(str(path), check_roots=False, roots=["/x"]).peer.replicas == 2
        else:
            with pytest.raises(ConfigError, match=r"peer\.replicas: expected 1 .* or 2"):
                load_config(str(path), check_roots=False, roots=["/x"])


def test_1024_nodes_and_a_million_files_meet_the_targets():
    out = subprocess.run([sys.executable, "-m", "monarch", "plan", "--nodes", "1024", "--files", "1000000",
                          "--file-size", "110KiB", "--json"], capture_output=True, text=True, timeout=240,
                         cwd=REPO, check=True).stdout
    p = json.loads(out)["placement"]
    assert p["max_share_over_mean"] <= 1.05
    assert p["moved_on_loss"] <= 2 / 1024


def test_a_peer_capacity_given_as_a_share_is_read_on_this_machine(tmp_path, monkeypatch):
    """peer.capacity: 50% is a share of the node, as for a tier (here of a node of 1,000 KiB)."""
    import monarch.node.tiers.resources
    from monarch.plan import node_storage
    monkeypatch.setattr(monarch.node.tiers.resources, "share_of_node", lambda path, share: (int(1000 * KiB * share), "x"))
    (tmp_path / "ds").mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset: {{roots: [{tmp_path}/ds]}}\n"
                   f"tiers:\n  - {{name: ram, path: {tmp_path}, capacity: 100KiB}}\n"
                   f"peer: {{path: {tmp_path}, capacity: 50%}}\n")
    stores = node_storage(load_config(str(job), env={"USER": "u"}))
    assert [(s.name, s.capacity) for s in stores] == [("ram", 100 * KiB), ("peer", 500 * KiB)]


# -- per-file costs and allocation --------------------------------------------------------

def test_staging_time_counts_files_not_only_bytes():
    """1 KiB files at 1 GiB/s are planned at the files' time, not the bytes': a node stages ~3,000 files/s."""
    from monarch.plan import FILES_PER_SECOND, Store, format_plan, make_plan, synthetic
    p = make_plan(synthetic(30000, KiB), 1, [Store("ssd", 2**30)], pfs_rate=2**30)
    s = p["staging"]
    assert s["bytes_seconds"] == 30000 * KiB / 2**30
    assert s["files_per_node"] == 30000 and s["file_rate"] == FILES_PER_SECOND == 3000
    assert s["seconds"] == s["files_seconds"] == 10.0 and s["bound"] == "files"
    assert "measured" in s["file_rate_from"] and "staging.files" in s["file_rate_from"]
    text = format_plan(p)
    assert "= 10.0 s, the slower of 0.0 s for the bytes at 1.0 GiB/s and 30,000 files on the busiest node " \
           "at 3,000 files/s: 10.0 s" in text
    assert "assumed : a node stages 3,000 files/s (the default, measured:" in text


def test_files_count_where_they_are_held_large_files_are_bound_by_bytes(cfg, capsys):
    from monarch.plan import Store, format_plan, make_plan, synthetic
    p = plan(capsys, "-c", cfg, "--files", "4", "--file-size", "100KiB", "--pfs-rate", "100KiB/s")
    assert p["staging"]["seconds"] == 4.0 and p["staging"]["bound"] == "bytes"
    p = plan(capsys, "-c", cfg, "--nodes", "2", "--files", "6000", "--file-size", "1KiB")
    assert p["staging"]["files_per_node"] == 400  # a node holds 400 KiB: the rest stays on the PFS, not staged
    p = make_plan(synthetic(6000, KiB), 2, [Store("ssd", 2**30)], shard=True)
    assert "= at least 1.0 s (3,000 files on the busiest node at 3,000 files/s: 1.0 s; give --pfs-rate for the " \
           "bytes)" in format_plan(p)


def test_owns_reads_as_bytes_and_says_its_files(cfg, capsys):
    p = plan(capsys, "-c", cfg, "--nodes", "4", "--files", "1200", "--file-size", "1KiB")
    for node in p["per_node"]:
        assert node["owns_bytes"] == node["owns"] == 300 * KiB and node["owns_files"] == 300
    main(["plan", "-c", cfg, "--nodes", "4", "--files", "1200", "--file-size", "1KiB"])
    assert "node 0  : owns 300.0 KiB (300 files), holds 300.0 KiB" in capsys.readouterr().out


def test_a_memory_tier_is_filled_by_4_KiB_pages():
    from monarch.plan import Store, format_plan, make_plan, synthetic
    stores = [Store("ram", 100 * KiB, in_memory=True), Store("ssd", 1000 * KiB), Store("peer", 0)]
    p = make_plan(synthetic(200, 1 * KiB), 1, stores, file_rate=100.0)
    (node,) = p["per_node"]
    assert node["tiers"] == {"ram": 25 * KiB, "ssd": 175 * KiB, "peer": 0}  # 25 files of 1 KiB take 100 KiB of pages
    assert p["allocation"] == {"page": 4096, "allocated_bytes": 200 * 4096, "overhead": 4.0, "in_memory": ["ram"]}
    assert p["staging"]["files_seconds"] == 2.0 and p["staging"]["file_rate_from"] == "given"
    text = format_plan(p)
    assert "alloc   : ram in memory: a file takes whole 4 KiB pages there, the dataset 800.0 KiB for 200.0 KiB " \
           "of data (x4.00); the plan fills it by pages" in text
    # files of whole pages: no overhead; a disk tier: none either
    assert make_plan(synthetic(10, 8 * KiB), 1, stores)["allocation"]["overhead"] == 1.0
    assert make_plan(synthetic(10, KiB), 1, [Store("ssd", 100 * KiB)])["allocation"]["overhead"] == 1.0


def test_the_plan_takes_the_node_file_rate_from_the_command_line(tmp_path):
    """monarch plan --file-rate: the per-file staging rate the plan assumes."""
    import subprocess
    import sys
    tree = tmp_path / "ds"
    tree.mkdir()
    for i in range(50):
        (tree / f"f{i}").write_bytes(b"x" * 10)
    run = lambda *extra: subprocess.run([sys.executable, "-m", "monarch", "plan", "--dataset", str(tree),  # noqa: E731
                                         "--nodes", "2", "--json", *extra], capture_output=True, text=True, timeout=60)
    slow, fast = run("--file-rate", "1"), run("--file-rate", "1000")
    assert slow.returncode == 0 and fast.returncode == 0, slow.stderr + fast.stderr
    assert slow.stdout != fast.stdout
    bad = run("--file-rate", "lots")
    assert bad.returncode == 2 and "--file-rate" in bad.stderr and "Traceback" not in bad.stderr


MiB = 1 << 20


def test_plan_says_a_replicated_loss_moves_nothing_and_what_its_seconds_are():
    from monarch import plan
    stores = [plan.Store("ram", 100 * MiB)]
    replicated = plan.format_plan(plan.make_plan(plan.synthetic(100, 100_000), 4, stores))
    assert "layout  : replicate" in replicated
    place = next(line for line in replicated.splitlines() if line.startswith("place"))
    assert "re-owns" not in place and "losing a node moves nothing" in place
    assert "s to place" not in place and "computing this placement took" in place
    sharded = plan.format_plan(plan.make_plan(plan.synthetic(100, 100_000), 4, stores, shard=True))
    place = next(line for line in sharded.splitlines() if line.startswith("place"))
    assert "(the largest share) is lost" in place and "s to place" not in place


def test_a_large_file_is_owned_by_ranges_spread_over_the_nodes():
    """A file staged by blocks is owned by 16 MiB ranges (each node reads its ranges from the
    PFS), not whole by one node: four nodes own a quarter of a 1 GiB file each."""
    from monarch.plan import Store, format_plan, make_plan
    gib = 1 << 30
    stores = [Store("ram", 2 * gib, in_memory=True)]
    p = make_plan([("0/tok.bin", gib), *((f"0/s/{i}.jpg", 1000) for i in range(400))], 4, stores)
    lf = p["large_files"]
    assert lf["files"] == 1 and lf["bytes"] == gib and lf["owned_per_node"] == [gib // 4] * 4
    assert p["dataset"] == {"files": 401, "bytes": gib + 400_000}
    assert [n["owns_bytes"] for n in p["per_node"]] == pytest.approx([gib // 4 + 100_000] * 4, rel=0.001)
    assert "owned by 16.0 MiB ranges, each read from the PFS by its owner: node 0 256.0 MiB" in format_plan(p)

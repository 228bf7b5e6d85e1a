"""The training-like workload: make a dataset, read it for epochs, catch wrong bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from monarch.tools import workload
from monarch.tools.workload import WorkloadError, make_dataset, parse_size, read_dataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    entries = make_dataset(root, files=40, size="8KiB", spread=0.5, seed=3)
    return root, entries


def test_parse_size():
    assert parse_size("100KiB") == 102400
    assert parse_size("16MiB") == 16 * 2**20
    assert parse_size("1.5KB") == 1500  # one parser for every size (monarch.sizes)
    assert parse_size("7") == 7
    with pytest.raises(WorkloadError, match="a size like 64GiB"):
        parse_size("64 Gigs")


def test_make_writes_files_and_a_manifest_beside_the_directory(dataset, tmp_path):
    root, entries = dataset
    manifest = tmp_path / "ds.manifest.json"
    assert manifest.exists() and not (root / "ds.manifest.json").exists()
    assert json.loads(manifest.read_text())["files"] == entries
    assert workload.list_files(root) == sorted(entries)
    assert len({os.path.dirname(rel) for rel in entries}) > 1  # a few subdirectories
    sizes = [e["size"] for e in entries.values()]
    assert len(set(sizes)) > 10 and 2000 < sum(sizes) / len(sizes) < 30000
    for rel, e in entries.items():
        data = (root / rel).read_bytes()
        assert len(data) == e["size"] and workload.digest(data) == e["xxh64"]


def test_make_is_deterministic_and_equal_sizes_without_spread(tmp_path):
    a = make_dataset(tmp_path / "a", files=5, size="1KiB", spread=0, seed=1)
    b = make_dataset(tmp_path / "b", files=5, size="1KiB", spread=0, seed=1)
    assert a == b and {e["size"] for e in a.values()} == {1024}


@pytest.mark.parametrize("reader", workload.READERS)
def test_read_every_file_once_per_epoch(dataset, tmp_path, reader):
    """In a process of its own: the reader forks its workers, as a loader does, and a fork of
    this test process (threads of earlier tests' in-process daemons alive) can hand a child a
    lock held at the fork (seen: a worker that never ended)."""
    root, entries = dataset
    code = ("import json, sys; from monarch.tools.workload import read_dataset; "
            "rs = read_dataset(sys.argv[1], epochs=2, workers=2, manifest=sys.argv[2], reader=sys.argv[3]); "
            "print(json.dumps([(r.epoch, r.samples, r.bytes, r.mismatches) for r in rs]))")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path / "ds.manifest.json"), reader],
                         capture_output=True, text=True, timeout=100, check=True, cwd=repo,
                         env=dict(os.environ, PYTHONPATH=repo)).stdout
    total = sum(e["size"] for e in entries.values())
    assert json.loads(out) == [[0, 40, total, []], [1, 40, total, []]]


def test_epochs_have_different_seeded_orders():
    files = [f"f{i}" for i in range(100)]
    e0, e1 = workload.epoch_order(files, 0, 0), workload.epoch_order(files, 0, 1)
    assert sorted(e0) == sorted(files) and e0 != e1 and e0 != files
    assert e0 == workload.epoch_order(files, 0, 0)
    assert e0 != workload.epoch_order(files, 1, 0)


def test_corrupted_file_is_detected(dataset, tmp_path):
    root, entries = dataset
    victim = sorted(entries)[7]
    data = bytearray((root / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    (root / victim).write_bytes(bytes(data))
    results = read_dataset(root, epochs=3, workers=2, manifest=tmp_path / "ds.manifest.json")
    assert len(results) == 1  # stops after the epoch that saw it
    assert len(results[0].mismatches) == 1 and results[0].mismatches[0].startswith(victim)


def test_cli_exit_code_and_json(dataset, tmp_path):
    root, entries = dataset
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "monarch.tools.workload", "read", str(root), "--epochs", "2", "--workers", "2",
           "--manifest", str(tmp_path / "ds.manifest.json"), "--json", str(out)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "samples/s" in ok.stdout
    assert [e["samples"] for e in json.loads(out.read_text())["epochs"]] == [40, 40]

    victim = sorted(entries)[0]
    (root / victim).write_bytes(b"wrong")
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "digest mismatch" in bad.stderr and victim in bad.stderr


def test_manifest_and_directory_must_agree(dataset, tmp_path):
    root, entries = dataset
    os.unlink(root / sorted(entries)[0])
    with pytest.raises(WorkloadError, match="1 missing"):
        read_dataset(root, epochs=1, workers=1, manifest=tmp_path / "ds.manifest.json")

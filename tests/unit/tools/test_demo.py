"""``monarch demo`` (monarch/tools/demo.py): its summary numbers epochs as the workload does and
puts the PFS traffic the emulated PFS counted beside the speed-up; without FUSE it says why in
one line and goes on on the local disk."""

from __future__ import annotations


def test_the_demo_numbers_epochs_as_its_workload_prints_them():
    from monarch.tools.demo import summary
    runs = [{"epoch": e, "seconds": 1.0 + e, "samples": 10, "bytes": 100, "mismatches": []} for e in range(3)]
    table = summary(runs, runs, 10).split("epoch       direct   monarch  speed-up\n")[1].splitlines()
    assert [line.split()[0] for line in table[:3]] == ["0", "1", "2"]


def test_the_demo_says_in_one_line_when_fuse_cannot_give_it_a_slow_pfs(tmp_path, monkeypatch, capsys):
    """No FUSE here (no /dev/fuse, no mfusepy): one line saying so and why; the demo goes on on the disk."""
    from contextlib import ExitStack
    from monarch.tools import demo, slowpfs
    monkeypatch.setattr(slowpfs, "fuse_unavailable_reason", lambda probe=False: "no /dev/fuse on this machine")
    with ExitStack() as stack:
        assert demo._mount(stack, str(tmp_path), str(tmp_path), 4.0) is None
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("demo: no emulated slow PFS here") and line.endswith("no /dev/fuse on this machine)")


def test_the_demo_prints_the_pfs_traffic_the_emulated_pfs_counted_beside_the_speed_up():
    from monarch.tools.demo import summary
    direct = [{"epoch": e, "seconds": 2.0, "samples": 10, "bytes": 100, "mismatches": []} for e in range(2)]
    under = [{"epoch": e, "seconds": 1.0 if e else 0.5, "samples": 10, "bytes": 100, "mismatches": []} for e in range(2)]
    text = summary(direct, under, 10, (200, 100, 100), 4.0)
    assert "0           2.00 s    0.50 s      4.0x" in text and "1           2.00 s    1.00 s      2.0x" in text
    assert text.endswith("PFS read, as the emulated PFS counted it (4 ms per open): directly 200 B = 2.00x the "
                         "dataset; under Monarch 100 B = 1.00x the dataset")

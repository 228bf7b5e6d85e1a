"""``monarch demo``'s table gives each command's wall time, launch to exit, beside its epochs: a wait
before the first epoch (a daemon's start, a library built at first use) shows in it."""

from __future__ import annotations


def test_the_demo_prints_each_commands_wall_time_beside_the_epochs():
    from monarch.tools.demo import summary
    direct = [{"epoch": e, "seconds": 1.0, "samples": 10, "bytes": 100, "mismatches": []} for e in range(3)]
    under = [{"epoch": e, "seconds": 0.5 if e else 0.8, "samples": 10, "bytes": 100, "mismatches": []}
             for e in range(3)]
    text = summary(direct, under, 10, (300, 100, 100), 4.0, walls=(3.6, 5.53))
    table = text.split("epoch       direct   monarch  speed-up\n")[1].splitlines()
    assert [line.split()[0] for line in table[:4]] == ["0", "1", "2", "command"]
    assert table[3] == "command     3.60 s    5.53 s      0.7x"
    assert "(command: the whole command's wall time, launch to exit" in text


def test_the_demo_runs_both_commands_and_times_each(tmp_path, monkeypatch, capsys):
    """The demo times the direct command and the one under ``monarch run`` (its own processes: the
    workload's, timed here without FUSE, a launcher's and a daemon's)."""
    import subprocess
    import types
    from monarch.tools import demo
    clock = iter([10.0, 12.5, 20.0, 27.0])
    # the demo's own clock only: a thread another test left (a pool, a server's) may read time.monotonic too
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(demo.subprocess, "run", fake_run)
    monkeypatch.setattr(demo, "files_in", lambda manifest: 0)
    monkeypatch.setattr("monarch.launch.cache.drop_dataset", lambda roots: None)
    (tmp_path / "manifest.json").write_text("{}")
    assert demo.demo(str(tmp_path), files=1, epochs=1, workers=1, open_latency_ms=0) == 0
    assert len(ran) == 2 and "run" in ran[1]
    assert "command     2.50 s    7.00 s      0.4x" in capsys.readouterr().out

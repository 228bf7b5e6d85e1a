"""``monarch run``'s order at its start: the shim is built (a checkout's changed source takes
seconds) before a daemon starts staging, so the job's first reads meet a daemon that has not
run ahead of them; a shim that cannot be built leaves no daemon behind."""

import sys

from monarch.config import load_config
from monarch.launch import run as run_module


def test_the_shim_is_built_before_the_daemon_starts_and_a_failed_build_starts_none(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(run_module, "shim_library", lambda: calls.append("shim") or (_ for _ in ()).throw(
        OSError("no C compiler")))
    monkeypatch.setattr(run_module, "attach_or_start", lambda config, run, out=None: calls.append("daemon"))
    code = run_module.run(load_config(None, check_roots=False), [sys.executable, "-c", "print('ran')"], str(tmp_path / "report.txt"),
                          progress=False)
    assert code == 0  # fail open: the command ran, on the PFS
    assert calls == ["shim"]

"""The report's words (monarch/report/text.py), and the HTML page saying the same: singular for
one, a tier offered no file, estimates labelled as such, a command as a shell takes it."""

from __future__ import annotations

import subprocess


# -- the words a newcomer reads ----------------------------------------------------------------

MiB = 1 << 20


def _report(**extra):
    from monarch.report.build import build_report
    command = extra.pop("command", ["true"])
    n = {"node": 0, "host": "h0", "opened_from": {"pfs": {"opens": 1, "bytes": MiB}, "ram": {"opens": 3, "bytes": 3 * MiB}},
         "staging": {"files": 1, "bytes": MiB, "pfs_files_read": 1, "pfs_bytes_read": MiB, "failures": {}},
         "dataset": {"files": 1, "bytes": MiB}, "peer": {}, "resolves": {}, "tiers": []} | extra
    return build_report([n], {"job_id": "j", "config": "c.yaml", "command": command,
                              "exit_code": 0, "wall_seconds": 1.0})


def _text(report) -> str:
    import io
    from monarch.report.text import print_report
    out = io.StringIO()
    print_report(report, out)
    return out.getvalue()


def test_one_is_singular():
    t = _text(_report(metadata={"local": 1, "pfs": 0}))
    assert "metadata  : 1 call answered from the snapshot" in t
    assert "dataset   : 1 file, 1.0 MiB" in t and "staged    : 1 file, 1.0 MiB" in t


TIERS = [{"name": "ram", "capacity": 4 * MiB, "used": MiB, "files": 1, "full": None, "refused": {}, "stopped": None},
         {"name": "ssd", "capacity": 8 * MiB, "used": 0, "files": 0, "full": None, "refused": {}, "stopped": None},
         {"name": "nvme", "capacity": MiB, "used": MiB, "files": 1, "full": None, "refused": {"full": 2},
          "stopped": "full"}]


def test_a_tier_offered_no_file_says_so_in_the_text_and_the_html_alike():
    from monarch.report import html
    from monarch.report.text import OFFERED_NONE
    r = _report(tiers=TIERS)
    rows = {line.split()[0]: line for line in _text(r).splitlines() if line.split()[:1] in (["ram"], ["ssd"], ["nvme"])}
    assert rows["ssd"].endswith(OFFERED_NONE) and "took every file" not in rows["ssd"]
    assert rows["ram"].endswith("took every file offered")
    page = "".join(html._tiers(r, None, None))
    for name, words in (("ram", "took every file offered"), ("ssd", OFFERED_NONE)):  # the same words in both
        assert words in rows[name] and html.html.escape(words) in page, (name, page)
    assert "full (its capacity is reached)" in rows["nvme"] and "full (capacity)" in page
    assert "taking files" not in page


def test_the_html_summary_labels_its_estimate_note_as_it_labels_the_figures():
    from monarch.report import html
    r = _report(opened_from={"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                             "ram": {"opens": 40, "bytes": 17 * MiB, "opens_uncounted": 0}})
    page = "".join(html._summary(r, r["job"], r["dataset"], r["pfs"]))
    assert f"PFS without Monarch ({html.ESTIMATE})" in page
    assert f'<p class="note">{html.ESTIMATE}: as if every byte the command read had been read from the PFS' in page


def test_a_script_in_the_command_reads_as_written_and_as_a_shell_takes_it():
    script = "for f in *; do\n  echo \"it's $f\"\ndone"
    command = ["sh", "-c", script]
    t = _text(_report(command=command))
    assert "'\"'\"'" not in t
    assert 'command   : sh -c "for f in *; do\n              echo \\"it\'s \\$f\\"\n            done"  (exit 0' in t
    from monarch.report.text import command_text
    said = subprocess.run(["bash", "-c", "printf '%s\\0' " + command_text(command)], capture_output=True,
                          text=True, timeout=30).stdout
    assert said.split("\0")[:-1] == command
    from monarch.report import html
    r = _report(command=command)
    assert html.html.escape(command_text(command)) in "".join(html._summary(r, r["job"], r["dataset"], r["pfs"]))

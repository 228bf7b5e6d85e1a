"""Seeing what Monarch does, end to end: live progress, the timeline and tiers in the report,
the HTML page, and a RAM tier that stops at the node's memory margin."""

import html.parser
import os
import sys

import pytest

from support.harness import load, monarch, monarch_env, reader, write_config

pytestmark = pytest.mark.integration


def slow_reader(ds, seconds):
    """Read every file once, print a known stdout, then keep running so progress gets polled."""
    script = ("import os, sys, time\n"
              f"for d, _, names in os.walk({ds.root!r}):\n"
              "    for n in sorted(names):\n"
              "        open(os.path.join(d, n), 'rb').read()\n"
              "print('app stdout line 1'); print('app stderr line', file=sys.stderr, flush=True)\n"
              f"time.sleep({seconds}); print('app stdout line 2')\n")
    return [sys.executable, "-c", script]


def test_progress_lines_while_the_command_runs_and_its_output_intact(dataset, short_tmp):
    ds = dataset(files=100, size="8KiB")
    cfg = write_config(short_tmp, ds.root)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *slow_reader(ds, 3.5),
                env=monarch_env(MONARCH_PROGRESS_INTERVAL=1))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "app stdout line 1\napp stdout line 2\n"  # the command's own output, untouched
    lines = r.stderr.splitlines()
    progress = [x for x in lines if x.startswith("monarch: staged ")]
    assert len(progress) >= 2, r.stderr  # whole lines (stderr is a pipe here), about one a second
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr
    assert f"monarch: staged 100/100 files, {ds.total / 1024:.1f} KiB" in progress[-1]
    assert "opens pfs 0 ram 100 ssd 0" in progress[-1]
    assert "app stderr line" in lines

    rep = load(report)
    assert rep["schema"] == "monarch.report/4"
    tl = rep["timeline"]
    assert len(tl["t"]) >= 3 and tl["interval"] == 1.0
    # the per-interval counts add up to the totals
    assert sum(tl["series"]["bytes.ram"]) == rep["opened_from"]["ram"]["bytes"] == ds.total
    assert sum(tl["series"]["opens.ram"]) == 100
    assert sum(tl["series"]["staged_bytes"]) == rep["staging"]["bytes"] == ds.total
    assert tl["series"]["used.ram"][-1] == ds.total
    ram = rep["tiers"][0]
    assert (ram["name"], ram["used"], ram["files"], ram["stopped"]) == ("ram", ds.total, 100, None)
    assert sum(c["staged"].get("ram", {}).get("files", 0) for c in rep["size_classes"]) == 100

    quiet = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", *slow_reader(ds, 1.5),
                    env=monarch_env(MONARCH_PROGRESS_INTERVAL=1))
    assert quiet.returncode == 0 and "monarch: staged" not in quiet.stderr


def test_a_ram_tier_past_the_memory_margin_stages_to_the_next_tier_and_says_why(dataset, short_tmp):
    pytest.importorskip("matplotlib")
    ds = dataset(files=60, size="16KiB")
    # a RAM tier far larger than the node, and a margin no node can keep: RAM takes nothing
    cfg = write_config(short_tmp, ds.root, ram="100%", extra="memory_margin: 100%\n")
    report, page = os.path.join(short_tmp, "report.json"), os.path.join(short_tmp, "report.html")
    r = monarch("run", "-c", cfg, "--report", report, "--report-html", page, "--",
                *reader(ds, epochs=2, workers=2))
    assert r.returncode == 0, r.stderr  # the reader checked every byte
    rep = load(report)
    ram, ssd = rep["tiers"][0], rep["tiers"][1]
    assert ram["used"] == 0 and ram["files"] == 0
    # each file the stager offered is counted; room the front door asked to be lent for its own
    # copies is refused once, for all the files it then copies into the SSD tier
    assert ram["stopped"] == "memory_margin" and set(ram["refused"]) <= {"memory_margin"}
    assert ram["refused"].get("memory_margin", 0) + rep["front_door"]["copies"] >= 60
    assert ssd["files"] == 60 and ssd["used"] == ds.total and ssd["stopped"] is None
    assert rep["opened_from"]["ssd"]["opens"] == 120 and rep["opened_from"]["ram"]["opens"] == 0
    node_ram = rep["nodes"][0]["tiers"][0]
    # (then cut to /dev/shm's size less the application's reserve there, where that is less)
    assert node_ram["in_memory"] and node_ram["capacity_from"].startswith("100% of available memory")
    # the printed report says what the JSON says (how many offers were refused: the door's copies
    # asked for room once, however many files it copied before the stager took the rest)
    refused = ram["refused"].get("memory_margin", 0)
    said = "stopped at the node's memory margin (memory_margin)" + (f"; refused memory_margin x{refused}" if refused else "")
    assert said in r.stderr
    assert "tier ram: stops taking files at 0 bytes" in open(_daemon_log(short_tmp)).read()

    class Sections(html.parser.HTMLParser):
        found = []

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.found.append(dict(attrs)["id"])
    parser = Sections()
    parser.feed(open(page).read())
    assert parser.found == ["summary", "opened-from", "traffic", "staging", "tiers", "size-classes"]


def _daemon_log(base):
    import glob
    logs = glob.glob(os.path.join(base, "run0", f"monarch-{os.getuid()}", "*-node0", "daemon.log"))
    assert len(logs) == 1, logs
    return logs[0]

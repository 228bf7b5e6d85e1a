"""The HTML report: one self-contained page, its sections and plots, nothing fetched."""

import base64
import html.parser
import json
import shutil
import subprocess

import pytest

from monarch.cli import main
from monarch.report.build import build_report

pytest.importorskip("matplotlib")
MiB = 2**20


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections, self.images, self.urls, self.tables, self.text = [], [], [], 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append(attrs)
        if tag == "table":
            self.tables += 1
        for name in ("src", "href", "action", "data"):
            if name in attrs:
                self.urls.append(attrs[name])

    def handle_data(self, data):
        self.text.append(data)


def node_stats(i, sent=0, received=0):
    return {"node": i, "host": f"h{i}",
            "opened_from": {"pfs": {"opens": 2, "bytes": 2 * MiB, "opens_uncounted": 0},
                            "ram": {"opens": 30, "bytes": 30 * MiB, "opens_uncounted": 0}},
            "staging": {"files": 8, "bytes": 8 * MiB, "pfs_files_read": 8, "pfs_bytes_read": 8 * MiB,
                        "failures": {"no_room": 2}},
            "dataset": {"files": 10, "bytes": 10 * MiB},
            "peer": {"bytes_sent": sent, "bytes_received": received}, "resolves": {},
            "tiers": [{"name": "ram", "capacity": 8 * MiB, "used": 8 * MiB, "files": 8, "full": None,
                       "refused": {"memory_margin": 2}, "stopped": "memory_margin"}],
            "timeline": {"start": 1000.0 + i, "interval": 1.0, "t": [1.0, 2.0, 3.0],
                         "series": {"bytes.ram": [0, 10 * MiB, 20 * MiB], "bytes.pfs": [MiB, MiB, 0],
                                    "opens.ram": [0, 10, 20], "staged_bytes": [4 * MiB, 4 * MiB, 0],
                                    "staged_files": [4, 4, 0], "pfs_staging_bytes": [4 * MiB, 4 * MiB, 0],
                                    "used.ram": [4 * MiB, 8 * MiB, 8 * MiB]}},
            "size_classes": [{"class": "<1MiB", "max_bytes": MiB, "files": 10, "bytes": 10 * MiB,
                              "staged": {"ram": {"files": 8, "bytes": 8 * MiB}}, "peer": {"files": 0, "bytes": 0},
                              "not_staged": {"files": 2, "bytes": 2 * MiB}}]}


def render(tmp_path, report):
    src = tmp_path / "report.json"
    src.write_text(json.dumps(report))
    out = tmp_path / "report.html"
    assert main(["report", "--html", str(out), str(src)]) == 0
    page = Page()
    page.feed(out.read_text())
    return page, out


def test_one_node_page_has_every_section_and_inline_plots(tmp_path):
    page, _ = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c", "command": ["x"],
                                                              "exit_code": 0, "wall_seconds": 3.0}))
    assert page.sections == ["summary", "opened-from", "traffic", "staging", "tiers", "size-classes"]
    assert len(page.images) == 4  # traffic, staging, tier occupancy, size classes
    for img in page.images:
        assert img["src"].startswith("data:image/svg+xml;base64,") and img["alt"]
        assert base64.b64decode(img["src"].split(",", 1)[1]).lstrip().startswith(b"<?xml")
    assert all(u.startswith("data:") for u in page.urls)  # nothing to fetch: opens offline
    text = " ".join(page.text)
    assert "stopped: memory margin" in text and "memory_margin ×2" in text
    assert "1.00× the dataset" in text


def test_a_cluster_page_shows_bytes_sent_and_received_per_node(tmp_path):
    report = build_report([node_stats(0, sent=3 * MiB), node_stats(1, received=3 * MiB)],
                          {"job_id": "j", "config": "c", "nodes": 2})
    assert report["timeline"]["t"] == [1.0, 2.0, 3.0, 4.0]  # two nodes a second apart, one grid
    page, _ = render(tmp_path, report)
    assert page.sections[-1] == "cluster" and len(page.images) == 5
    assert "3.0 MiB" in " ".join(page.text)


def test_an_old_report_still_renders(tmp_path):
    r = build_report([node_stats(0)], {"job_id": "j", "config": "c"})
    old = {("sources" if k == "opened_from" else k): v for k, v in r.items()
           if k not in ("tiers", "size_classes", "timeline")} | {"schema": "monarch.report/2"}
    old["nodes"] = [{("sources" if k == "opened_from" else k): v for k, v in n.items()} for n in old["nodes"]]
    page, _ = render(tmp_path, old)
    assert "traffic" in page.sections and "no time series" in " ".join(page.text)
    assert page.sections[1] == "opened-from" and "30.0 MiB" in page.text  # the /2 report's "sources"


@pytest.mark.timeout(120)
def test_a_browser_renders_it(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium to render the page (apt-get install chromium)")
    _, out = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c"}))
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,1800",
                    f"--screenshot={shot}", out.as_uri()], capture_output=True, timeout=100, cwd=tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_page_is_readable_by_its_owner_only(tmp_path):
    import os
    import stat
    old = os.umask(0o022)
    try:
        _, out = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c"}))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def _svg_of(img) -> str:
    return base64.b64decode(img["src"].split(",", 1)[1]).decode()


def test_a_run_shorter_than_its_sampling_interval_says_so_and_draws_bars(tmp_path):
    """One sample: no flat one-point line plots; "too short to plot", the staged share as bars."""
    stats = node_stats(0)
    stats["timeline"] = {"start": 1000.0, "interval": 1.0, "t": [1.0],
                         "series": {"bytes.ram": [30 * MiB], "bytes.pfs": [2 * MiB], "staged_bytes": [8 * MiB],
                                    "staged_files": [8], "pfs_staging_bytes": [8 * MiB], "used.ram": [8 * MiB]}}
    page, _ = render(tmp_path, build_report([stats], {"job_id": "j", "config": "c"}))
    assert "Too short to plot over time" in " ".join(page.text)
    assert [img["alt"] for img in page.images] == ["share of the dataset staged", "dataset bytes by file size and place"]
    bars = _svg_of(page.images[0])
    assert 'id="staged-bars"' in bars and bars.count("<g id=\"patch_") >= 3  # background + two bars


def test_bytes_staged_is_drawn_over_files_staged_and_told_apart(tmp_path):
    """Files of one size: the two staging lines coincide; bytes (dashed) is drawn last, on top."""
    page, _ = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c"}))
    (staging,) = [img for img in page.images if img["alt"] == "staging progress over time"]
    svg = _svg_of(staging)
    files, data = svg.index('id="staged-files"'), svg.index('id="staged-bytes"')
    assert files < data
    assert "stroke-dasharray" in svg[data:svg.index("</g>", data)]


def test_the_summary_marks_without_monarch_and_saved_as_estimates(tmp_path):
    page, _ = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c"}))
    text = " ".join(page.text)
    assert "PFS without Monarch (estimate)" in text and "PFS saved (estimate)" in text
    assert "a page cache absorbs re-reads" in text

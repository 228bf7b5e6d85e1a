"""The HTML report: one self-contained page, its sections and plots, nothing fetched."""

import base64
import html.parser
import json

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


PLOTS = ["bytes read per second by source", "staging progress over time", "tier occupancy over time",
         "dataset bytes by file size and place"]  # what a one-node page with a time series draws


def wide_tiers_stats():
    """A node whose tier rows hold the longest words: an allocation well above the bytes, three
    reasons of refusal, a tier offered no file (the table was 1,490 px wide in a 1,200 px window)."""
    stats = node_stats(0)
    stats["tiers"] = [{"name": "ram", "capacity": 8 * MiB, "used": 2 * MiB, "allocated_bytes": 8 * MiB, "files": 800,
                       "full": None, "refused": {"memory_margin": 2, "no_room": 123, "too_large": 7},
                       "stopped": "memory_margin"},
                      {"name": "ssd", "capacity": 64 << 30, "used": 0, "files": 0, "refused": {}, "stopped": None}]
    return stats


def browser_drawn(page: str, tmp_path):
    from support.browser import chromium, drawn
    if chromium() is None:  # scripts/install.sh installs it: CI runs this test, never skips it
        pytest.fail("chromium is not installed: bash scripts/install.sh installs it (apt-get install chromium)")
    return drawn(page, tmp_path, width=1200)


@pytest.mark.timeout(200)
def test_a_browser_draws_every_plot_and_table_within_a_1200_pixel_window(tmp_path):
    from support.browser import problems
    _, out = render(tmp_path, build_report([wide_tiers_stats()], {"job_id": "j", "config": "c", "command": ["x"],
                                                                   "exit_code": 0, "wall_seconds": 3.0}))
    page = browser_drawn(out.read_text(), tmp_path)
    assert problems(page, PLOTS) == []
    assert [p.alt for p in page.plots] == PLOTS
    assert all(p.natural[0] > 300 and p.box[2] - p.box[0] > 600 for p in page.plots)  # decoded, drawn wide
    assert [(t["section"], t["rows"]) for t in page.tables] == [
        ("summary", 10), ("opened-from", 3), ("staging", 2), ("tiers", 3), ("size-classes", 2)]


@pytest.mark.timeout(300)
def test_the_browser_check_finds_a_plot_missing_undecodable_or_blank(tmp_path):
    """The check above fails when a plot is not on the page, when the browser cannot decode it,
    and when it decodes to an empty picture."""
    import re
    from support.browser import problems
    _, out = render(tmp_path, build_report([node_stats(0)], {"job_id": "j", "config": "c"}))
    page = out.read_text()
    img = {alt: re.search(r'<img class="plot" alt="' + re.escape(alt) + r'" src="[^"]*">', page).group(0)
           for alt in PLOTS}
    blank = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" width="700" height="300"></svg>').decode()
    broken = page.replace(img[PLOTS[0]], "").replace(img[PLOTS[1]], img[PLOTS[1]][:200] + '">') \
        .replace(img[PLOTS[2]], f'<img class="plot" alt="{PLOTS[2]}" src="data:image/svg+xml;base64,{blank}">')
    found = problems(browser_drawn(broken, tmp_path), PLOTS)
    assert found[0] == f"plot {PLOTS[0]!r}: not on the page"
    assert found[1] == f"plot {PLOTS[1]!r}: the browser could not decode it"
    assert found[2].startswith(f"plot {PLOTS[2]!r}: drawn blank (0.0% inked")
    assert len(found) == 3  # the size classes' plot was drawn


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

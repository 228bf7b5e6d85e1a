"""What a browser draws of a page: chromium, headless, reports where each plot and table landed
and what the plots' pixels hold. Used by the HTML report's tests (tests/unit/report/test_html.py).

``drawn(page_html, workdir, width)`` loads a copy of the page with a probe script appended (run
at the load event, after every image decoded: each ``<img>``'s natural size and box, each
table's box and rows, the page's scroll width), reads the probe back from the DOM chromium dumps
(``--dump-dom``), takes a screenshot of the whole page at the same width and counts, in each
plot's box, the pixels that are not the page's white and the colours among them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# what chromium needs here (root, no display, no network): its sandbox needs a user namespace
# root has no use for, and a fresh profile keeps runs apart
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
TIMEOUT_S = 100

PROBE = """<script>
window.addEventListener("load", () => {
  const box = e => { const r = e.getBoundingClientRect();
    return {left: r.left + scrollX, right: r.right + scrollX, top: r.top + scrollY, width: r.width, height: r.height}; };
  const out = {inner: innerWidth, scroll_width: document.documentElement.scrollWidth,
               scroll_height: document.documentElement.scrollHeight, plots: [], tables: []};
  for (const img of document.images)
    out.plots.push({alt: img.alt, complete: img.complete, natural: [img.naturalWidth, img.naturalHeight], ...box(img)});
  for (const t of document.querySelectorAll("table"))
    out.tables.push({section: t.closest("section") ? t.closest("section").id : null, rows: t.rows.length,
                     cells: t.rows.length ? t.rows[0].cells.length : 0, ...box(t)});
  const pre = document.createElement("pre"); pre.id = "monarch-probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Plot:
    alt: str
    natural: tuple[int, int]   # 0 x 0: the browser could not decode it
    box: tuple[int, int, int, int]  # left, top, right, bottom in page pixels
    inked: float = 0.0         # share of its pixels that are not white
    colours: int = 0           # distinct colours among them (coarsely quantized)


@dataclass
class Drawn:
    width: int                 # the window's inner width
    scroll_width: int          # the page's: wider than the window means something sticks out
    plots: list[Plot]
    tables: list[dict]


def _run(browser: str, workdir: Path, args: list[str]) -> subprocess.CompletedProcess:
    profile = workdir / f"profile-{len(list(workdir.glob('profile-*')))}"
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=workdir)


def drawn(page_html: str, workdir: Path, width: int = 1200) -> Drawn:
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (bash scripts/install.sh installs it: apt-get install chromium)")
    page = workdir / "probed.html"
    page.write_text(page_html.replace("</body>", PROBE + "</body>", 1))
    dom = _run(browser, workdir, [f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom",
                                  page.as_uri()])
    found = re.search(r'<pre id="monarch-probe">(.*?)</pre>', dom.stdout, re.S)
    if not found:
        raise RuntimeError(f"chromium did not run the page's probe (exit {dom.returncode}): {dom.stderr[-2000:]}")
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                       .replace("&amp;", "&"))
    plots = [Plot(p["alt"], tuple(p["natural"]),
                  (round(p["left"]), round(p["top"]), round(p["right"]), round(p["top"] + p["height"])))
             for p in probe["plots"]]
    shot = workdir / "shot.png"
    _run(browser, workdir, [f"--window-size={width},{probe['scroll_height']}", f"--screenshot={shot}",
                            "--virtual-time-budget=10000", page.as_uri()])
    if not shot.exists():
        raise RuntimeError("chromium took no screenshot of the page")
    from PIL import Image
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        for plot in plots:
            left, top, right, bottom = plot.box
            if right - left < 4 or bottom - top < 4:
                continue
            area = rgb.crop((left + 2, top + 2, right - 2, bottom - 2))
            raw = area.tobytes()
            pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
            ink = [p for p in pixels if min(p) < 225]
            plot.inked = len(ink) / len(pixels)
            plot.colours = len({(r >> 5, g >> 5, b >> 5) for r, g, b in ink})
    return Drawn(probe["inner"], probe["scroll_width"], plots, probe["tables"])


def problems(drawn_page: Drawn, plots: list[str]) -> list[str]:
    """What is wrong with the page as drawn: a plot of ``plots`` (their alt texts) missing, not
    decoded or blank; a table or the page wider than the window; an empty table."""
    out = []
    by_alt = {p.alt: p for p in drawn_page.plots}
    for alt in plots:
        p = by_alt.get(alt)
        if p is None:
            out.append(f"plot {alt!r}: not on the page")
        elif not all(p.natural):
            out.append(f"plot {alt!r}: the browser could not decode it")
        elif p.inked < 0.01 or p.colours < 3:
            out.append(f"plot {alt!r}: drawn blank ({100 * p.inked:.1f}% inked, {p.colours} colours)")
        elif p.box[2] > drawn_page.width:
            out.append(f"plot {alt!r}: its right edge {p.box[2]} px is past the window's {drawn_page.width} px")
    for t in drawn_page.tables:
        if t["right"] > drawn_page.width:
            out.append(f"table of {t['section']}: its right edge {t['right']:.0f} px is past the window's "
                       f"{drawn_page.width} px")
        if t["rows"] < 1 or t["height"] < 10:
            out.append(f"table of {t['section']}: drawn empty")
    if drawn_page.scroll_width > drawn_page.width:
        out.append(f"the page is {drawn_page.scroll_width} px wide in a {drawn_page.width} px window")
    return out

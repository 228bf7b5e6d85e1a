"""The report as one self-contained HTML page: the summary tables and plots, nothing to fetch.

Plots are drawn with matplotlib (imported here only, lazily, without pyplot: no display,
no global backend) as SVG and embedded as ``data:`` URIs, so the page opens offline and
can be mailed or attached to a ticket as one file. ``monarch report --html OUT REPORT.json``
or ``monarch run --report-html OUT`` (or ``report_html`` in the configuration) write it.
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Any

from monarch.errors import MonarchError
from monarch.report.text import (ESTIMATE_WHY, UNCOUNTED_NOTE, allocation_words, command_text, figure,
                                  opened_from_amount, pfs_fallback_lines, plural, shares, tier_allocation,
                                  tier_state_words, times_dataset)
from monarch.sizes import human

MiB = 1 << 20
# a tier's state in the table's column; a tier that stopped for none of these is described as the text does
STATES = {"full": "full (capacity)", "memory_margin": "stopped: memory margin",
          "filesystem_reserve": "stopped: filesystem reserve", "filesystem_full": "filesystem full"}
ESTIMATE = "estimate"  # the summary's label of a modelled figure, and of the note that says what it models
COLORS = {"pfs": "#d62728", "peer": "#9467bd", "staging": "#ff7f0e", "not staged": "#bbbbbb"}
TIER_COLORS = ["#2ca02c", "#1f77b4", "#17becf", "#8c564b", "#e377c2", "#7f7f7f"]

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 62em;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; } th { background: #f5f5f5; }
.meta { color: #666; font-size: 0.9em; } .note { color: #666; font-size: 0.88em; }
table.kv td:last-child { text-align: left; white-space: pre-wrap; }  /* a command of several lines keeps them */
th.words, td.words { white-space: normal; min-width: 7em; }  /* words wrap: the table stays within the page */
img.plot { width: 100%; max-width: 60em; display: block; margin: 0.5em 0; }
"""


def write_html(report: dict, path: str) -> None:
    """Write the page through a fresh temporary name (never through a planted symlink),
    readable by its owner only (as the JSON report)."""
    from monarch.secure import write_file_atomically
    page = render_html(report).encode()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_file_atomically(path, page, mode=0o600)
    except OSError as e:
        raise MonarchError(f"html report {path}: cannot write it: {e.strerror}; choose another path") from None


def require_matplotlib(asked_by: str = "the HTML report") -> Any:
    """matplotlib's Figure, or MonarchError naming who asked for it and how to install it
    (``monarch run`` asks before the command starts, not after the job ended)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MonarchError(f"{asked_by} needs matplotlib, which is not installed; "
                           "pip install 'monarch-staging[html]' (or: pip install matplotlib)") from None
    return Figure


def render_html(report: dict) -> str:
    Figure = require_matplotlib()
    e = html.escape
    job, ds, pfs = report.get("job", {}), report.get("dataset", {}), report.get("pfs", {})
    out = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           f"<title>Monarch report {e(str(job.get('run_id') or job.get('job_id', '')))}</title><style>{CSS}</style></head><body>",
           "<h1>Monarch access report</h1>",
           f"<p class=\"meta\">schema {e(report.get('schema', '?'))} &middot; created {e(report.get('created', '?'))}"
           f" &middot; job {e(str(job.get('job_id', '?')))}"
           + (f" &middot; run {e(str(job['run_id']))}" if job.get("run_id") else "") + "</p>"]
    out += _summary(report, job, ds, pfs)
    out += _opened_from(report)
    timeline = report.get("timeline")
    over_time = _plottable(timeline)
    out.append('<section id="traffic"><h2>Bytes read over time, by source</h2>')
    if over_time:
        out.append(_img(_plot_traffic(Figure, timeline), "bytes read per second by source"))
        out.append(f"<p class=\"note\">One point per {timeline['interval']:g} s (the daemon's samples; long "
                   "jobs are merged into coarser points). PFS (staging) is what Monarch read to stage; "
                   "the other lines are what the application read from each source.</p>")
    elif timeline and timeline.get("t"):
        out.append(_too_short(timeline))
    else:
        out.append("<p class=\"note\">This report has no time series (reports before monarch.report/3).</p>")
    out.append("</section>")
    out.append('<section id="staging"><h2>Staging progress</h2>')
    if over_time:
        out.append(_img(_plot_staging(Figure, timeline, ds), "staging progress over time"))
    elif timeline and timeline.get("t"):
        out.append(_img(_plot_staged_bars(Figure, report.get("staging", {}), ds), "share of the dataset staged"))
    out += _staging_table(report)
    out.append("</section>")
    out += _tiers(report, timeline, Figure)
    out += _size_classes(report, Figure)
    out += _cluster(report, Figure)
    out.append("</body></html>\n")
    return "\n".join(out)


# -- tables ------------------------------------------------------------------------------------
def _table(header: list[str] | None, rows: list[list[Any]], css: str = "", wrap: tuple[int, ...] = ()) -> str:
    """A table; the columns numbered in ``wrap`` hold words that wrap (a state, reasons), so the
    table stays within the page; the others hold figures, kept on one line."""
    e = html.escape
    cls = lambda i: ' class="words"' if i in wrap else ""  # noqa: E731
    head = ("<thead><tr>" + "".join(f"<th{cls(i)}>{e(h)}</th>" for i, h in enumerate(header)) + "</tr></thead>"
            if header else "")
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{e(str(c))}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table{f' class={css!r}' if css else ''}>{head}<tbody>{body}</tbody></table>"


def _bytes(n: Any, lower: bool = False) -> str:
    if n is None:
        return "unknown"
    return f"≥ {human(n)}" if lower else human(n)


def _summary(report: dict, job: dict, ds: dict, pfs: dict) -> list[str]:
    lower = set(pfs.get("lower_bounds", ()))
    rows = []
    if job.get("command"):
        rows.append(["command", command_text(job["command"])])
        rows.append(["exit code, wall time", f"{job.get('exit_code')}, {job.get('wall_seconds', 0):.2f} s"])
    rows.append(["dataset", f"{plural(ds.get('files', 0), 'file')}, {human(ds.get('bytes', 0))}"])
    if report.get("processes_with_shim") is not None:
        rows.append(["processes with the shim", f"{report['processes_with_shim']}"])
    for line in pfs_fallback_lines(report):  # "start : ...", "warning : ...": the PFS when Monarch was not ready
        label, _, text = line.partition(":")
        rows.append([label.strip(), text.strip()])
    rows.append(["nodes reporting", f"{report.get('nodes_reporting', 1)}"
                 + (f" (lost: {report['nodes_lost']})" if report.get("nodes_lost") else "")])
    rows.append(["PFS read by the application", figure(pfs, "app_bytes")])
    rows.append(["PFS read by Monarch to stage", _bytes(pfs.get("staging_bytes", 0))])
    rows.append(["PFS total", figure(pfs, "total_bytes") + times_dataset(pfs, lower, False, x="×")])
    est = set(pfs.get("estimated", ()))
    rows.append(["PFS without Monarch" + (f" ({ESTIMATE})" if "without_monarch_bytes" in est else ""),
                 figure(pfs, "without_monarch_bytes")])
    if pfs.get("saved_bytes") is not None:
        at_least = "≥ " if "saved_fraction" in lower else ""
        frac = f" ({at_least}{100 * pfs['saved_fraction']:.1f}%)" if pfs.get("saved_fraction") is not None else ""
        rows.append(["PFS saved" + (f" ({ESTIMATE})" if "saved_bytes" in est else ""),
                     _bytes(pfs["saved_bytes"], "saved_bytes" in lower) + frac])
    st = report.get("staging", {})
    rows.append(["staged", f"{plural(st.get('files', 0), 'file')}, {human(st.get('bytes', 0))}"])
    out = ['<section id="summary"><h2>Summary</h2>', _table(None, rows, css="kv")]
    if est and pfs.get("without_monarch_bytes") is not None:
        out.append(f"<p class=\"note\">{ESTIMATE}: {html.escape(ESTIMATE_WHY)}.</p>")
    if pfs.get("opens_uncounted"):
        n = pfs["opens_uncounted"]
        note = UNCOUNTED_NOTE.format(opens=plural(n, "open"), were="was" if n == 1 else "were")
        out.append(f"<p class=\"note\">{html.escape(note)}.</p>")
    out.append("</section>")
    return out


def _opened_from(report: dict) -> list[str]:
    opened_from = report.get("opened_from", {})
    share = shares(opened_from)
    rows = [[name, c.get("opens", 0), opened_from_amount(c), share[name]] for name, c in opened_from.items()]
    return ['<section id="opened-from"><h2>Where the application read from</h2>',
            _table(["source", "opens", "bytes read", "share of bytes read"], rows), "</section>"]


def _staging_table(report: dict) -> list[str]:
    failures = report.get("staging", {}).get("failures", {})
    if not failures:
        return ["<p class=\"note\">Every file Monarch tried to stage was staged.</p>"]
    return ["<p>Not staged, by reason:</p>",
            _table(["reason", "files"], [[k, v] for k, v in sorted(failures.items())])]


def _tiers(report: dict, timeline: dict | None, Figure) -> list[str]:
    tiers = report.get("tiers")
    if tiers is None:  # an older report: the first node's tiers
        nodes = [n for n in report.get("nodes", []) if n]
        tiers = nodes[0].get("tiers", []) if nodes else []
    out = ['<section id="tiers"><h2>Tier occupancy</h2>']
    rows = []
    for t in tiers:
        cap = t.get("capacity") or 0
        refused = {k: v for k, v in (t.get("refused") or {}).items() if v}
        state = t.get("stopped") or ("filesystem_full" if t.get("full") else None)
        allocated = tier_allocation(report, t)
        words = allocation_words(t.get("used", 0), allocated)  # small files in whole blocks or pages
        taken = t.get("used", 0) if allocated is None else allocated  # what the capacity counts
        rows.append([t["name"], human(t.get("used", 0)) + (f" ({words})" if words else ""), human(cap),
                     f"{100 * taken / cap:.1f}%" if cap else "-", t.get("files", 0),
                     tier_state_words({**t, "stopped": state}, STATES),
                     ", ".join(f"{k} ×{v}" for k, v in sorted(refused.items())) or "-"])
    out.append(_table(["tier", "used", "capacity", "full", "files", "state", "files refused, by reason"], rows,
                      wrap=(1, 5, 6)))
    if _plottable(timeline) and any(k.startswith("used.") for k in timeline.get("series", {})):
        out.append(_img(_plot_tiers(Figure, timeline, tiers), "tier occupancy over time"))
    out.append("</section>")
    return out


def _size_classes(report: dict, Figure) -> list[str]:
    classes = report.get("size_classes")
    if not classes:
        return []
    tiers = sorted({t for c in classes for t in c.get("staged", {})})
    blocks = any((c.get("by_blocks") or {}).get("files") for c in classes)
    rows = []
    for c in classes:
        if not c["files"]:
            continue
        row = [c["class"], c["files"], human(c["bytes"])]
        row += [f"{c['staged'].get(t, {}).get('files', 0)} ({human(c['staged'].get(t, {}).get('bytes', 0))})"
                for t in tiers]
        if blocks:
            bb = c.get("by_blocks") or {}
            row.append(f"{bb.get('files', 0)} ({human(bb.get('bytes', 0))} of {human(bb.get('of_bytes', 0))})")
        ns = c["not_staged"]
        row.append(f"{ns['files']} ({human(ns['bytes'])})")
        rows.append(row)
    return ['<section id="size-classes"><h2>Where the dataset is, by file size</h2>',
            _table(["file size", "files", "bytes", *[f"in {t}" for t in tiers],
                    *(["by blocks (staged of their bytes)"] if blocks else []), "not staged (read from the PFS)"],
                   rows),
            _img(_plot_classes(Figure, classes, tiers), "dataset bytes by file size and place"),
            "<p class=\"note\">From the daemon's snapshot and its staged copies: files not staged are read "
            "from the PFS (a tier full, at the memory margin, or never opened).</p></section>"]


def _cluster(report: dict, Figure) -> list[str]:
    nodes = report.get("nodes", [])
    if len(nodes) < 2:
        return []
    rows = []
    for i, n in enumerate(nodes):
        if not n:
            rows.append([i, "lost", "", "", "", ""])
            continue
        p = n.get("peer", {})
        rows.append([i, n.get("host", ""), human(p.get("bytes_sent", 0)), human(p.get("bytes_received", 0)),
                     human(n.get("staging", {}).get("bytes", 0)),
                     human(n.get("opened_from", {}).get("pfs", {}).get("bytes", 0)
                           + n.get("staging", {}).get("pfs_bytes_read", 0))])
    return ['<section id="cluster"><h2>Nodes</h2>',
            _table(["node", "host", "sent to peers", "received from peers", "staged", "PFS read"], rows),
            _img(_plot_nodes(Figure, nodes), "bytes sent and received per node"), "</section>"]


# -- plots -------------------------------------------------------------------------------------
def _plottable(timeline: dict | None) -> bool:
    """Lines over time need two samples: a run shorter than the daemon's sampling interval has
    one, which would draw flat one-point plots."""
    return bool(timeline) and len(timeline.get("t") or ()) >= 2


def _too_short(timeline: dict) -> str:
    return (f"<p class=\"note\">Too short to plot over time: the run took less than two of the daemon's "
            f"sampling intervals ({timeline.get('interval', 1):g} s each). The tables give its totals.</p>")


def _img(svg: bytes, alt: str) -> str:
    return (f'<img class="plot" alt="{html.escape(alt)}" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(svg).decode()}">')


def _svg(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


def _new(Figure, height: float = 3.2):
    fig = Figure(figsize=(9, height))
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _times(timeline: dict) -> list[float]:
    return [0.0] + list(timeline["t"])


def _color(name: str, tier_names: list[str]) -> str:
    if name in COLORS:
        return COLORS[name]
    i = tier_names.index(name) if name in tier_names else len(tier_names)
    return TIER_COLORS[i % len(TIER_COLORS)]


def _plot_traffic(Figure, timeline: dict) -> bytes:
    fig, ax = _new(Figure)
    series, t = timeline["series"], _times(timeline)
    names = [k.split(".", 1)[1] for k in series if k.startswith("bytes.")]
    tier_names = [n for n in names if n not in ("pfs", "peer")]
    spans = [max(b - a, 1e-9) for a, b in zip(t, t[1:])]
    lines = [(f"bytes.{n}", n) for n in names] + [("pfs_staging_bytes", "PFS (staging)")]
    for key, label in lines:
        if key not in series:
            continue
        rates = [v / MiB / dt for v, dt in zip(series[key], spans)]
        color = COLORS["staging"] if key == "pfs_staging_bytes" else _color(label, tier_names)
        ax.step(t, [rates[0]] + rates if rates else [0], where="pre", label=label, color=color,
                linestyle="--" if key == "pfs_staging_bytes" else "-", linewidth=1.6)
    ax.set_xlabel("seconds since the daemon started")
    ax.set_ylabel("MiB/s")
    ax.set_ylim(bottom=0)
    _legend_above(ax)
    return _svg(fig)


def _cumulative(values: list[int]) -> list[int]:
    out, total = [0], 0
    for v in values:
        total += v
        out.append(total)
    return out


# files first, wide and pale; bytes on top, dashed: equal shares (files of one size) show both
STAGED_LINES = (("staged_files", "files", "files staged", "#2ca02c", {"linewidth": 4.0, "alpha": 0.45}),
                ("staged_bytes", "bytes", "bytes staged", "#1f77b4", {"linewidth": 1.8, "linestyle": "--"}))


def _plot_staging(Figure, timeline: dict, ds: dict) -> bytes:
    fig, ax = _new(Figure)
    series, t = timeline["series"], _times(timeline)
    for key, of, label, color, style in STAGED_LINES:
        whole = ds.get(of)
        if key in series and whole:
            ax.plot(t, [100 * v / whole for v in _cumulative(series[key])], label=label, color=color,
                    gid=key.replace("_", "-"), **style)
    ax.set_xlabel("seconds since the daemon started")
    ax.set_ylabel("% of the dataset")
    ax.set_ylim(0, 105)
    _legend_above(ax)
    return _svg(fig)


def _plot_staged_bars(Figure, staging: dict, ds: dict) -> bytes:
    """A run too short to plot over time: the share of the dataset staged at its end, in bars."""
    fig, ax = _new(Figure, height=1.6)
    rows = [(label, 100 * staging.get(of, 0) / ds[of] if ds.get(of) else 0.0, color)
            for _, of, label, color, _ in STAGED_LINES]
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=[r[2] for r in rows], gid="staged-bars")
    ax.set_xlim(0, 105)
    ax.set_xlabel("% of the dataset staged at the end of the run")
    return _svg(fig)


def _plot_tiers(Figure, timeline: dict, tiers: list[dict]) -> bytes:
    """Bytes in each tier over time; its capacity dashed when it is in sight (a RAM tier of
    64 GiB that stopped at the memory margin after 200 MiB would flatten the plot)."""
    fig, ax = _new(Figure)
    series, t = timeline["series"], _times(timeline)
    names = [tier["name"] for tier in tiers]
    capacity = {tier["name"]: tier.get("capacity") or 0 for tier in tiers}
    used = {k[5:]: column for k, column in series.items() if k.startswith("used.")}
    peak = max((v for column in used.values() for v in column), default=0)
    unit, scale = ("GiB", 2**30) if peak >= 2**30 else ("MiB", MiB)
    for name, column in used.items():
        color = _color(name, names)
        ax.plot(t, [0.0] + [v / scale for v in column], label=name, color=color, linewidth=1.8)
        cap = capacity.get(name)
        if cap and cap <= 1.5 * max(peak, 1):
            ax.axhline(cap / scale, color=color, linestyle=":", linewidth=1.2, label=f"{name} capacity")
    ax.set_xlabel("seconds since the daemon started")
    ax.set_ylabel(f"{unit} in the tier")
    ax.set_ylim(bottom=0)
    _legend_above(ax)
    return _svg(fig)


def _legend_above(ax) -> None:
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False, ncol=6)


def _plot_classes(Figure, classes: list[dict], tiers: list[str]) -> bytes:
    rows = [c for c in classes if c["files"]]
    fig, ax = _new(Figure, height=0.6 + 0.55 * max(1, len(rows)))
    labels = [c["class"] for c in rows]
    left = [0.0] * len(rows)
    for name in [*tiers, "by blocks", "not staged"]:
        if name == "by blocks":  # the staged blocks; the rest of those files is the PFS's
            widths = [(c.get("by_blocks") or {}).get("bytes", 0) / MiB for c in rows]
            if not any(widths):
                continue
        elif name == "not staged":
            widths = [(c["not_staged"]["bytes"] + (c.get("by_blocks") or {}).get("of_bytes", 0)
                       - (c.get("by_blocks") or {}).get("bytes", 0)) / MiB for c in rows]
        else:
            widths = [c["staged"].get(name, {}).get("bytes", 0) / MiB for c in rows]
        ax.barh(labels, widths, left=left, label=name, color=_color(name, tiers))
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("MiB of the dataset")
    _legend_above(ax)
    return _svg(fig)


def _plot_nodes(Figure, nodes: list[dict | None]) -> bytes:
    fig, ax = _new(Figure)
    idx = list(range(len(nodes)))
    sent = [(n or {}).get("peer", {}).get("bytes_sent", 0) / MiB for n in nodes]
    received = [(n or {}).get("peer", {}).get("bytes_received", 0) / MiB for n in nodes]
    ax.bar([i - 0.2 for i in idx], sent, width=0.4, label="sent to peers", color="#1f77b4")
    ax.bar([i + 0.2 for i in idx], received, width=0.4, label="received from peers", color="#ff7f0e")
    ax.set_xticks(idx, [f"node {i}" for i in idx])
    ax.set_ylabel("MiB")
    _legend_above(ax)
    return _svg(fig)

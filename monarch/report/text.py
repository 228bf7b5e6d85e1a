"""The report as the text table ``monarch run`` and ``monarch report`` print."""

from __future__ import annotations

import math
import re
import shlex
from typing import TextIO

from monarch.protocol import ENV_INDEX_WAIT, HEARTBEAT_TIMEOUT_MS, SHIM_INDEX_WAIT_MS_DEFAULT
from monarch.records.node_stats import bytes_read_range
from monarch.sizes import human, human_range
from monarch.report.sharing import sharing_lines
from monarch.store.report import store_lines

# a tier's state (``stopped``), in the text and the HTML report alike
STATE_WORDS = {None: "took every file offered", "full": "full (its capacity is reached)",
               "memory_margin": "stopped at the node's memory margin (memory_margin)",
               "filesystem_reserve": "stopped at its filesystem's reserve for the application (filesystem_reserve)",
               "filesystem_full": "its filesystem is full"}
OFFERED_NONE = "offered no file (the tiers before it took them)"


def tier_state_words(tier: dict, words: dict | None = None) -> str:
    """Why a tier stopped taking files (``stopped``, in ``words``: the HTML's are shorter), or
    that it took every file offered, or that it was offered none (no file, no refusal: the
    tiers before it took every file), in the same words for both."""
    state = tier.get("stopped")
    if state is None:
        return OFFERED_NONE if not tier.get("files") and not any((tier.get("refused") or {}).values()) \
            else STATE_WORDS[None]
    return (words or STATE_WORDS).get(state, state)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 call``, ``2 calls``."""
    return f"{n} {word if n == 1 else words or word + 's'}"


_DOUBLE_QUOTED_SPECIAL = re.compile(r'([$`"\\])')


def command_text(command: list[str]) -> str:
    """The command as a shell would take it, readable: a word holding a single quote (a
    script given to ``sh -c``, say) is double-quoted with ``$ ` " \\`` escaped, instead of
    shlex's ``'"'"'``; a word that spans lines keeps its lines."""
    words = []
    for word in command:
        if "'" in word:
            words.append('"' + _DOUBLE_QUOTED_SPECIAL.sub(r"\\\1", word) + '"')
        else:
            words.append(shlex.quote(word))
    return " ".join(words)


def pfs_fallback_lines(report: dict) -> list[str]:
    """Why calls under the roots went to the PFS when Monarch was not ready or not there (the
    shim's EXTRA_EARLY_* and EXTRA_LOST_* counters): one line per reason that happened."""
    out = []
    early = report.get("pfs_before_index") or {}
    if early.get("opens") or early.get("metadata"):
        walk = early.get("walk_seconds")
        # a wait that covers the walk, in whole seconds: what the shim's calls then wait for at most
        wait = f"={max(1, math.ceil(walk)) * 1000}" if walk is not None else " above the walk's time (ms)"
        out.append(f"start     : {plural(early['opens'], 'open')} and {plural(early['metadata'], 'stat')} went to the "
                   f"PFS before the index was ready"
                   + (f" (the walk took {walk:.1f} s)" if walk is not None else " (the walk had not ended)")
                   + f"; {ENV_INDEX_WAIT}{wait} makes the shim wait for it (default "
                   f"{SHIM_INDEX_WAIT_MS_DEFAULT} ms)")
    lost = report.get("pfs_daemon_lost") or {}
    if lost.get("opens") or lost.get("metadata"):
        out.append(f"warning   : the shim lost its daemon (unreachable, or silent for "
                   f"{HEARTBEAT_TIMEOUT_MS / 1000:.1f} s): {plural(lost['opens'], 'open')} and "
                   f"{plural(lost['metadata'], 'stat')} went to the PFS")
    return out


def _amount(n: float | None, lower: bool, most: float | None = None) -> str:
    """Bytes for the table: ``≥`` for a lower bound, ``A to B`` for a lower bound with an upper one
    (``most``), ``unknown`` for None."""
    if n is None:
        return "unknown"
    return human_range(n, most if lower else n)


def figure(pfs: dict, key: str) -> str:
    """A PFS figure of the report as it is known: exact, a range (``at_most``) or a lower bound."""
    return _amount(pfs.get(key), key in pfs.get("lower_bounds", ()), (pfs.get("at_most") or {}).get(key))


def opened_from_amount(counts: dict) -> str:
    """The bytes of one place opens were served from: exact when the shim saw every byte, else
    the bytes it counted as a lower bound, up to the lengths mapped when mmap hid the rest."""
    return human_range(*bytes_read_range(counts))


def shares(opened_from: dict) -> dict[str, str]:
    """Each place's share of the bytes read: exact, or a range when some places' bytes are ranges
    (the least: its least against the others' most; the most: its most against the others' least;
    a place with no upper bound may hold almost every byte)."""
    ranges = {name: bytes_read_range(c) for name, c in opened_from.items()}
    out = {}
    for name, (lo, hi) in ranges.items():
        others = [r for other, r in ranges.items() if other != name]
        others_lo = sum(low for low, _ in others)
        others_hi = None if any(high is None for _, high in others) else sum(high for _, high in others)
        if others_hi == 0:  # the others read nothing: this place read all there was
            least = most = 0.0 if hi == 0 else 1.0
        else:
            least = 0.0 if others_hi is None else lo / (lo + others_hi)
            most = 1.0 if hi is None else (hi / (hi + others_lo) if hi + others_lo else 0.0)
        low_text, high_text = f"{100 * least:.1f}", f"{100 * most:.1f}"
        out[name] = f"{low_text}%" if low_text == high_text else f"{low_text}-{high_text}%"
    return out


def print_report(report: dict, out: TextIO) -> None:
    job, pfs, ds = report["job"], report["pfs"], report["dataset"]
    lower = set(pfs.get("lower_bounds", ()))
    w = out.write
    w("\n== Monarch access report ==\n")
    if job.get("command"):
        shown = command_text(job["command"]).replace("\n", "\n" + " " * len("command   : "))  # its lines aligned
        w(f"command   : {shown}  (exit {job.get('exit_code')}, {job.get('wall_seconds', 0):.2f} s)\n")
    unsized = f" (of the {plural(ds['files'] - ds['unsized'], 'file')} stat'ed: {ds['unsized']} more were listed only)" \
        if ds.get("unsized") else ""
    w(f"dataset   : {plural(ds['files'], 'file')}, {human(ds['bytes'])}{unsized}\n")
    scope = job.get("scope")
    if scope:  # one run on a job's standing daemon: its part, not the node's whole story
        before = scope["staged_before"]
        w(f"scope     : this run's part only, while it was attached to the job's standing daemon (which had "
          f"staged {plural(before['files'], 'file')}, {human(before['bytes'])} before); the node's whole "
          f"report: {scope['node_report']} at the daemon's stop (node 0's has every node)\n")
    _print_shim_presence(report, w)
    _print_fallbacks(report, w)
    _print_writeback(report.get("writeback"), w)
    _print_raw_calls(report.get("raw_calls"), w)
    if report["nodes_lost"]:
        w(f"nodes lost: {report['nodes_lost']} (their numbers are missing)\n")
    amounts = {name: opened_from_amount(c) for name, c in report["opened_from"].items()}
    width = max([16] + [len(a) + 2 for a in amounts.values()])
    w(f"\n{'opened from':<12}{'opens':>10}{'bytes read':>{width}}{'share of bytes read':>22}\n")
    share = shares(report["opened_from"])
    for name, c in report["opened_from"].items():
        w(f"{name:<10}{c['opens']:>12}{amounts[name]:>{width}}{share[name]:>22}\n")
    w("\nPFS traffic\n")
    w(f"  read by the application : {figure(pfs, 'app_bytes')}\n")
    w(f"  read by Monarch to stage: {human(pfs['staging_bytes'])}\n")
    w(f"  total                   : {figure(pfs, 'total_bytes')}{times_dataset(pfs, lower, bool(scope))}\n")
    if scope and scope["staged_before"]["bytes"]:
        w(f"  staged before this run  : {human(scope['staged_before']['bytes'])} (in the node's whole report)\n")
    _print_without_monarch(pfs, lower, w)
    for line in store_lines(report.get("store")):
        w(line)
    st = report["staging"]
    w(f"\nstaged    : {plural(st['files'], 'file')}, {human(st['bytes'])}")
    w(f"; not staged: {', '.join(f'{k} x{v}' for k, v in sorted(st['failures'].items()))}\n" if st["failures"] else "\n")
    if report.get("tiers"):
        _print_tiers(report, w)
    for name, e in (report.get("tier_errors") or {}).items():
        where = f" (nodes {', '.join(map(str, e['nodes']))})" if len(report["nodes"]) > 1 else ""
        w(f"tier {name} not used{where}: {e['reason']}\n")
    for line in sharing_lines(report):
        w(f"{line}\n")
    if report.get("size_classes"):
        _print_size_classes(report["size_classes"], w)
    for line in block_lines(report.get("blocks")):
        w(line)
    meta = report.get("metadata")
    if meta and (meta["local"] or meta["pfs"]):
        w(f"metadata  : {plural(meta['local'], 'call')} answered from the snapshot, {meta['pfs']} sent to the PFS "
          "(stat, access, directory listings under the roots)\n")
    for line in pfs_fallback_lines(report):
        w(f"{line}\n")
    for t in report.get("tiers", []):
        if t.get("compressed_files"):
            c = t["compression"][0]
            w(f"tier {t['name']:<5}: {human(t['logical_bytes'])} in {human(t['stored_bytes'])} = {t['ratio']:.2f}x; "
              f"{t['compressed_files']} of {t['files']} files compressed (zstd level {c.get('level')}"
              f"{', dictionary' if c.get('dictionary') else ''}; {c.get('selection', {}).get('reason', '')})\n")
            z = report.get("decompression") or {}
            if z.get("opens"):
                w(f"{'':<11}  {z['opens']} opens decoded in the application's process: {human(z['bytes'])} in "
                  f"{z['ns'] / 1e9:.3f} s ({z['ns'] / z['opens'] / 1e3:.0f} us per open, "
                  f"{z['bytes'] / max(z['ns'], 1):.2f} GB/s), {z.get('reused', 0)} of them into a reused memfd; "
                  f"{z['left_to_daemon']} left to the daemon\n")
            if t.get("decoded_files"):
                w(f"{'':<11}  {t['decoded_files']} decoded files ({human(t['decoded_bytes'])}) held at the job's "
                  "end for re-opens at native speed (counted as opens of the tier)\n")
    door = report.get("front_door")
    if door and (door["copies"] or door["answered_staged"]):
        w(f"daemon    : {door['copies']} misses copied and {door['answered_staged']} opens of staged copies "
          f"answered in C (the front door); {door['handed_over']} requests handed to the Python server\n")
    if report.get("cluster"):
        cl = report["cluster"]
        w(f"cluster   : {cl['mode']} ({cl['why']})\n")
        for r in cl["per_node"]:
            about = "about " if r.get("owned_estimated") else ""
            w(f"  node {r['node']}: owns {about}{r['owned_files']} files ({human(r['owned_bytes'])}), staged "
              f"{r['owned_staged_files']}; peers sent {human(r['peer_bytes_sent'])}, received "
              f"{human(r['peer_bytes_received'])}; cache hits {r['cache_hits']}, evictions {r['evictions']}, "
              f"transient {r['transient']}\n")
    if report["peer"]:
        p = report["peer"]
        wire = p.get("wire_bytes_received", p.get("bytes_received", 0))
        on_wire = (f" ({human(wire)} on the wire: compressed copies cross as stored)"
                   if wire < p.get("bytes_received", 0) else "")
        w(f"peers     : sent {human(p.get('bytes_sent', 0))}, received {human(p.get('bytes_received', 0))}"
          f"{on_wire}\n")
    if len(report["nodes"]) > 1:
        _print_nodes(report, w)
    uncounted = pfs.get("opens_uncounted")
    if uncounted:
        w(f"\n{UNCOUNTED_NOTE.format(opens=plural(uncounted, 'open'), were='was' if uncounted == 1 else 'were')}\n")
    elif uncounted is None:  # a report from a shim that does not tell such opens apart
        w("\nbytes are those read with read/pread/readv; mmap and stdio reads count opens only\n")


def _print_nodes(report: dict, w) -> None:
    """One row per node: its bytes per place, staged, and its PFS total (ranges as the totals)."""
    rows = []
    for n in report["nodes"]:
        if not n:
            rows.append(None)
            continue
        app_low, app_high = bytes_read_range(n["opened_from"].get("pfs", {}))
        staged = n["staging"]["pfs_bytes_read"]
        rows.append([opened_from_amount(n["opened_from"].get(name, {})) for name in report["opened_from"]]
                    + [human(n["staging"]["bytes"]),
                       human_range(app_low + staged, None if app_high is None else app_high + staged)])
    header = [*report["opened_from"], "staged", "pfs total"]
    widths = [max([12] + [len(row[k]) + 2 for row in rows if row]) for k in range(len(header))]
    w(f"\n{'node':<6}" + "".join(f"{name:>{width}}" for name, width in zip(header, widths)) + "\n")
    for i, row in enumerate(rows):
        w(f"{i:<6}lost\n" if row is None else f"{i:<6}" + "".join(f"{c:>{wd}}" for c, wd in zip(row, widths)) + "\n")


def times_dataset(pfs: dict, lower: set[str], scope: bool, x: str = "x") -> str:
    """`` = 1.00x the dataset``, `` = at least 0.42x``, or `` = 0.42x to 2.40x`` (a range)."""
    ratio = pfs.get("reads_of_dataset")
    if ratio is None:
        return ""
    most = (pfs.get("at_most") or {}).get("reads_of_dataset")
    if "reads_of_dataset" not in lower:
        times = f"{ratio:.2f}{x}"
    elif most is not None:
        times = f"{ratio:.2f}{x} to {most:.2f}{x}"
    else:
        times = f"at least {ratio:.2f}{x}"
    return f" = {times} the dataset" + (" during this run" if scope else "")


def _print_shim_presence(report: dict, w) -> None:
    """How many processes ran with the shim: 0 means it was never loaded (see monarch/report/bypass.py)."""
    procs, readers = report.get("processes_with_shim"), report.get("processes_at_roots")
    if procs is not None:
        of = f", {readers} of them under the roots" if readers is not None else ""
        w(f"shim      : active in {procs} process{'' if procs == 1 else 'es'} (processes with the shim{of})\n")


def _print_fallbacks(report: dict, w) -> None:
    """Each way the command came to read the dataset without Monarch: what, and the fix
    (monarch/report/fallbacks.py)."""
    for f in report.get("fallbacks") or ():
        w(f"fallback  : {f['reason']}: {f['detail']}; fix: {f['fix']}\n")


def _print_restart(wb: dict, w) -> None:
    """Where the files earlier runs published were read from (node/kept_reads.py)."""
    sources = [(what, wb.get(f"restart_{key}_files") or 0, wb.get(f"restart_{key}_bytes") or 0)
               for key, what in (("tier", "this node's tier"), ("partner", "the partner's copy"),
                                 ("peer", "another node's copy"), ("pfs", "the PFS (changed since)"))]
    if not any(files for _, files, _ in sources):
        return
    saved = wb.get("restart_saved_seconds") or 0
    w("            earlier runs' files read from: "
      + ", ".join(f"{what} {plural(files, 'file')} {human(nbytes)}" for what, files, nbytes in sources if files)
      + (f"; about {saved:.2f} s of PFS reads saved (est., at the PFS's rate when they were written)" if saved else "")
      + "\n")


def _print_writeback(wb: dict | None, w) -> None:
    """What the job wrote under the write-back paths, and what reached the PFS
    (docs/consistency.md, "Write-back")."""
    if not wb:
        return
    w(f"write-back: {plural(wb['files_closed'], 'file')}, {human(wb['bytes_written'])} written by the job; "
      f"{plural(wb['files_published'], 'file')}, {human(wb['bytes_published'])} published to the PFS "
      f"(draining {wb['drain_seconds']:.2f} s; at most {human(wb['peak_pending_bytes'])} pending)\n")
    app = sum(wb.get(k) or 0 for k in ("app_write_seconds", "app_close_seconds", "app_sync_seconds"))
    direct = wb.get("direct_estimate_seconds")
    w(f"            the job's writes, closes and fsyncs took {app:.2f} s"
      + (f"; straight to the PFS at its measured {human(wb['pfs_write_rate'])}/s about {direct:.2f} s (est.)"
         if direct is not None else "")
      + (f"; the drain ran {wb['drain_after_job_seconds']:.2f} s after the job ended"
         if wb.get("drain_after_job_seconds") is not None else "") + "\n")
    if wb.get("partner_bytes_sent") or wb.get("partner_records"):
        w(f"            copied to the partner nodes: {human(wb['partner_bytes_sent'])}, "
          f"{plural(wb.get('partner_records') or 0, 'record')} in {wb.get('partner_seconds') or 0:.2f} s "
          f"(fsync: partner: a lost node loses nothing it closed or fsynced)\n")
    if wb.get("held_for_lost_published"):
        w(f"            published for lost nodes from their copies held here: "
          f"{plural(wb['held_for_lost_published'], 'file')}\n")
    if wb.get("files_written_through") or wb.get("opened_through"):
        w(f"            written through to the PFS: {plural(wb.get('files_written_through') or 0, 'file')} larger "
          f"than the room, {plural(wb.get('opened_through') or 0, 'open')} for update\n")
    if wb.get("kept_files") or wb.get("served_files") or wb.get("stale"):
        w(f"            kept on the node for the next run: {plural(wb.get('kept_files') or 0, 'file')}, "
          f"{human(wb.get('kept_bytes') or 0)}; read from kept copies instead of the PFS: "
          f"{plural(wb.get('served_files') or 0, 'open')}, {human(wb.get('served_bytes') or 0)}"
          + (f"; {plural(wb['stale'], 'kept copy', 'kept copies')} changed on the PFS since (read from it)"
             if wb.get("stale") else "") + "\n")
    _print_restart(wb, w)
    if wb["not_closed"]:
        w(f"            {plural(wb['not_closed'], 'file')} the job did not close (killed while writing): "
          f"not published, kept in {', '.join(wb['kept_in'])}\n")
    for why in wb["failed"]:
        w(f"            NOT PUBLISHED: {why}\n")
    for path, where in wb["unpublished"].items():
        w(f"            {path}: not on the PFS; its bytes are kept in {where} (`monarch drain` publishes them)\n")


def _print_raw_calls(raw: dict | None, w) -> None:
    """What watching the system calls made without libc cost (docs/consistency.md, W10)."""
    if not raw:
        return
    calls = ", ".join(f"{name} {n:,}" for name, n in list(raw["by_call"].items())[:6])
    w(f"raw calls : {raw['answered']:,} made without libc answered by the shim ({calls}), {raw['ns'] / 1e6:.1f} ms"
      + (f"; threads paused in a compute runtime {raw['paused']:,} times" if raw.get("paused") else "") + "\n")


# what a range or a lower bound of bytes means, in the text and the HTML report alike
UNCOUNTED_NOTE = ("{opens} {were} read through mmap or stdio, whose reads the shim does not all see: each byte "
                  "it saw is counted (read, pread, fread), and a figure that holds such opens is a range: at "
                  "least what was counted, at most that plus the lengths mmap mapped (\"A to B\"), or a lower "
                  "bound (\"≥ A\") where a FILE read some (stdio's own reads have no bound)")
ESTIMATE_WHY = ("as if every byte the command read had been read from the PFS; a page cache absorbs "
                "re-reads of a file's bytes (h5py chunks, headers read per sample), so without Monarch the "
                "PFS may have served less")
ESTIMATE_NOTE = f"est.: {ESTIMATE_WHY}\n"  # "est." as the figures it explains are marked


def _print_without_monarch(pfs: dict, lower: set[str], w) -> None:
    """The figures that model a run without Monarch: marked as estimates (``est.``) when the report
    says so, the saving as a share only when that share means something (``saved_fraction``)."""
    est = set(pfs.get("estimated", ()))
    label = lambda name, key: f"{name} (est.)" if key in est else name  # noqa: E731
    w(f"  {label('without Monarch', 'without_monarch_bytes'):<24}: {figure(pfs, 'without_monarch_bytes')}\n")
    saved, fraction = pfs["saved_bytes"], pfs["saved_fraction"]
    if saved is None or (fraction is None and not pfs.get("opens_uncounted") and saved >= 0):
        return
    why = ""
    if fraction is not None:
        why = f" ({'≥ ' if 'saved_fraction' in lower else ''}{100 * fraction:.1f}%)"
    elif saved < 0:
        why = (": Monarch read more from the PFS than the command read (read-ahead stages what fits "
               "of the dataset, whatever the command reads)")
    w(f"  {label('saved', 'saved_bytes'):<24}: {_amount(saved, 'saved_bytes' in lower)}{why}\n")
    if est and pfs["without_monarch_bytes"] is not None:
        w(f"  {ESTIMATE_NOTE}")


def tier_allocation(report: dict, tier: dict) -> int | None:
    """What the filesystems allocate for a tier's copies (blocks, tmpfs pages: what its
    capacity counts), summed over the nodes reporting; None in a report from before tiers
    counted it."""
    if "allocated_bytes" in tier:
        return tier["allocated_bytes"]
    found = [t["allocated_bytes"] for n in report.get("nodes") or [] if n
             for t in n.get("tiers") or [] if t.get("name") == tier["name"] and "allocated_bytes" in t]
    return sum(found) if found else None


def allocation_words(used: int, allocated: int | None) -> str | None:
    """``allocated 4.0 MiB = 4.00x the bytes`` when the allocation is 5% or more above the
    files' bytes (small files in whole blocks or pages), else None: nothing worth a line."""
    if allocated is None or allocated <= used * 1.05:
        return None
    return f"allocated {human(allocated)}" + (f" = {allocated / used:.2f}x the bytes" if used else "")


def _print_tiers(report: dict, w) -> None:
    """One row per tier: its files' bytes against its capacity, how full (by what its filesystem
    allocates, what the capacity counts), and under it the allocation when it is well above
    the bytes, and why a tier that stopped at its filesystem's reserve, or that had no room
    beside it from the start, stopped."""
    w(f"\n{'tier':<10}{'used':>12} / {'capacity':<18}{'files':>8}  state\n")
    nodes = [n for n in report.get("nodes") or [] if n]
    for t in report["tiers"]:
        cap = t.get("capacity") or 0
        allocated = tier_allocation(report, t)
        pct = f" ({100 * (t['used'] if allocated is None else allocated) / cap:.0f}%)" if cap else ""
        refused = {k: v for k, v in (t.get("refused") or {}).items() if v}
        why = f"; refused {', '.join(f'{k} x{v}' for k, v in sorted(refused.items()))}" if refused else ""
        w(f"{t['name']:<10}{human(t['used']):>12} / {human(cap) + pct:<18}{t.get('files', 0):>8}  "
          f"{tier_state_words(t)}{why}\n")
        if words := allocation_words(t["used"], allocated):
            w(f"{'':<10}{'':>12}   {words} (whole blocks or pages: what the capacity counts)\n")
        if not t.get("files") and (words := no_room_words(
                [x for n in nodes for x in n.get("tiers") or [] if x.get("name") == t["name"]], len(nodes))):
            w(f"{'':<10}{'':>12}   could take no file: {words}\n")
        elif t.get("stopped") == "filesystem_reserve" and (words := reserve_words(report, t)):
            w(f"{'':<10}{'':>12}   {words}\n")


def no_room_words(tiers: list[dict], nodes: int = 1, now: bool = False) -> str | None:
    """Why a tier takes no file (``tiers``: its entries of the nodes' ``tiers``, of ``nodes``): its
    filesystem had no more free than the application's reserve when the daemon made it (the first
    node where it had, with how many), and the key that changes it; None where it had room."""
    short = [t for t in tiers if t.get("filesystem_free_at_start") is not None
             and t["filesystem_free_at_start"] <= t.get("filesystem_reserve", 0)]
    if not short:
        return None
    t = short[0]
    free, reserve = t["filesystem_free_at_start"], t.get("filesystem_reserve", 0)
    when = "" if now else " when the daemon started"
    where = f" on {len(short)} of {nodes} nodes" if nodes > 1 else ""
    return (f"its filesystem {'has' if now else 'had'} {human(free)} free{when}{where}, "
            f"{'less' if free < reserve else 'no more'} than the {human(reserve)} it leaves free for the "
            f"application: {t.get('filesystem_reserve_from') or 'filesystem_reserve'}; a smaller filesystem_reserve "
            "(a size, a share, or 0) lets it take files")


def reserve_words(report: dict, tier: dict) -> str | None:
    """What a tier that stopped at its filesystem's reserve left free, and where that came from
    (each node's tiers say; the first that does, with how many nodes kept one), or None."""
    kept = [t for n in report.get("nodes") or [] if n
            for t in n.get("tiers") or [] if t.get("name") == tier["name"] and "filesystem_reserve" in t]
    if not kept:
        return None
    nodes = f" on each of {len(kept)} nodes" if len(kept) > 1 else ""
    return (f"left {human(kept[0]['filesystem_reserve'])} of its filesystem free for the application{nodes}: "
            f"{kept[0].get('filesystem_reserve_from') or 'filesystem_reserve'}")


def _print_size_classes(classes: list[dict], w) -> None:
    w(f"\n{'file size':<10}{'files':>8}{'bytes':>12}  where (files, bytes)\n")
    for c in classes:
        if not c["files"]:
            continue
        places = [f"{tier} {v['files']} ({human(v['bytes'])})" for tier, v in sorted(c["staged"].items())]
        if c.get("peer", {}).get("files"):
            places.append(f"peer {c['peer']['files']} ({human(c['peer']['bytes'])})")
        bb = c.get("by_blocks") or {}
        if bb.get("files"):
            places.append(f"by blocks {bb['files']} ({human(bb['bytes'])} of {human(bb['of_bytes'])})")
        ns = c["not_staged"]
        if ns["files"]:
            places.append(f"not staged {ns['files']} ({human(ns['bytes'])})")
        w(f"{c['class']:<10}{c['files']:>8}{human(c['bytes']):>12}  {', '.join(places)}\n")


def block_lines(blocks: dict | None) -> list[str]:
    """The large files staged by blocks (>=16MiB), and where their bytes were read from."""
    if not blocks:
        return []
    r = blocks["read"]
    out = [f"by blocks : {plural(blocks['files'], 'large file')} staged by blocks, {blocks['whole_files']} whole; "
           f"partly staged: {plural(blocks['partly_staged_files'], 'file')}, {human(blocks['partly_staged_bytes'])} "
           f"of {human(blocks['partly_staged_of_bytes'])}\n"]
    if blocks.get("blocks_from_peers") or blocks.get("blocks_peer_failed"):  # a cluster's ranges
        out.append(f"{'':<12}blocks staged from the PFS: {blocks['blocks_from_pfs']:,} ({human(blocks['bytes_from_pfs'])}),"
                   f" from their owners: {blocks['blocks_from_peers']:,} ({human(blocks['bytes_from_peers'])}); "
                   f"read from the PFS when the owner could not send them: {blocks['blocks_peer_failed']:,}"
                   + (f"; left the window of a file larger than the room, for others: {blocks['blocks_left_window']:,}"
                      if blocks.get("blocks_left_window") else "") + "\n")
    if r["opens"]:
        out.append(f"{'':<12}{plural(r['opens'], 'open')} while staging: {human(r['local_bytes'])} read from staged "
                   f"blocks, {human(r['pfs_bytes'])} from the PFS; {human(r['remapped_bytes'])} of mappings moved "
                   "onto the copies\n")
    if r.get("faults_held") or r.get("faults_late") or r.get("faults_pages"):
        out.append(f"{'':<12}mapping faults that waited for their block from its owner: {r['faults_held']:,} "
                   f"({r['fault_wait_ns'] / 1e9:.2f} s in all); served with their pages from it: "
                   f"{r.get('faults_pages', 0):,}; read from the PFS, their block not here in time: "
                   f"{r['faults_late']:,}\n")
    return out

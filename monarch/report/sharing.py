"""What a job says of its shared copies: at its start (the launcher), and in its report."""

from __future__ import annotations

import time

from monarch.sizes import human

__all__ = ["sharing_at_start", "sharing_lines"]

FREE_NOW = "monarch cache drop"  # the command that frees a user's unused copies on the node now


def sharing_at_start(tiers: dict | None) -> list[str]:
    """One line per tier whose sharing the user should know of at once: one that cannot be
    shared on this node (a per-job /tmp or /dev/shm), one that joined with another capacity."""
    lines = []
    for name, t in (tiers or {}).items():
        why = t.get("not_shared")
        if why and "job_container" in why:
            lines.append(f"tier {name}: {why}")
        elif not why and t.get("capacity") != t.get("configured_capacity"):
            lines.append(f"tier {name}: joins the copies of {t.get('jobs', 0)} running job(s) in {t.get('path')} "
                         f"with their capacity, {human(t.get('capacity') or 0)} (this job's configuration says "
                         f"{human(t.get('configured_capacity') or 0)})")
    return lines


def sharing_lines(report: dict) -> list[str]:
    """The report's lines on sharing, per node's tier: what this job read from copies another
    job staged, why a tier was private, and what the last job out left and until when."""
    lines = []
    for node in report.get("nodes") or []:
        for t in (node or {}).get("tiers", []):
            name, shared = t.get("name"), t.get("shared")
            if t.get("not_shared"):
                lines.append(f"tier {name} not shared: {t['not_shared']}")
            if not shared or not (shared.get("from_others_files") or shared.get("waited") or shared.get("left_until")
                                  or t.get("files") or shared.get("restaged_files") or shared.get("resumed_files")):
                continue  # a shared tier nothing was put in or read from: nothing to say
            joined = shared.get("jobs_at_join", 0)
            lines.append(f"tier {name} shared: {shared.get('from_others_files', 0)} files "
                         f"({human(shared.get('from_others_bytes', 0))}) were copies another job staged; "
                         f"{joined} other job(s) used {shared['path']} when this one joined"
                         + (f"; waited {shared['waited']} times for a copy another job was staging"
                            if shared.get("waited") else ""))
            if shared.get("restaged_files"):
                n = shared["restaged_files"]
                lines.append(f"tier {name} re-staged: changed since the set's copy: {n} file{'s' if n != 1 else ''} "
                             f"({human(shared.get('restaged_bytes', 0))}), the set's copy replaced")
            if shared.get("resumed_files"):
                n = shared["resumed_files"]
                lines.append(f"tier {name} resumed: {n} large file{'s' if n != 1 else ''} another job left partly "
                             f"staged, {human(shared.get('resumed_bytes', 0))} of "
                             f"{human(shared.get('resumed_of_bytes', 0))} kept, the rest staged from there")
            if shared.get("configured_capacity") not in (None, shared.get("capacity")):
                lines.append(f"tier {name}: joined with the set's capacity, {human(shared['capacity'])} "
                             f"(this job's configuration says {human(shared['configured_capacity'])})")
            until = shared.get("left_until")
            if until:
                lines.append(f"left      : {human(shared.get('set_bytes', 0))} of shared copies in {shared['path']} "
                             f"until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(until))} "
                             f"(staging.linger); `{FREE_NOW}` frees them now")
    return lines

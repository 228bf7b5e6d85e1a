"""``monarch cache ls`` and ``monarch cache drop``: a user's shared and kept copies on this node.

The places looked at are the tier bases of the configuration (the shipped one without
``-c``) and any ``--base`` given: in each, the user's ``monarch-<uid>`` directory. A set in
use by a running job (its lease held) is never removed; ``--expired`` removes only the
shared sets whose linger is over (a set whose last job was killed lingers from when that
is first noticed). A Slurm epilog frees what the job's user left for nobody with
``runuser -u "$SLURM_JOB_USER" -- monarch cache drop --expired`` (docs/sharing.md).
"""

from __future__ import annotations

import os
import time
from typing import TextIO

from monarch.config import Config
from monarch.errors import MonarchError
from monarch.node.tiers.shared_set import SetInfo, drop_set, list_sets
from monarch.secure import UnsafePathError, user_dir
from monarch.sizes import human

__all__ = ["bases", "ls", "drop", "drop_dataset"]


def bases(config: Config | None, extra: list[str] | None) -> list[str]:
    """The tier bases to look in (each once, in order): the configuration's, then ``extra``."""
    found: list[str] = []
    for base in [t.path for t in (config.tiers if config is not None else ())] + list(extra or ()):
        real = os.path.realpath(base)
        if real not in found:
            found.append(real)
    return found


def _sets(places: list[str], notice: bool = False) -> list[SetInfo]:
    out = []
    for base in places:
        if not os.path.isdir(os.path.join(base, f"monarch-{os.getuid()}")):
            continue
        try:
            parent = user_dir(base)
        except (UnsafePathError, OSError):
            continue
        out += list_sets(parent, notice=notice)
    return out


def _state(info: SetInfo, now: float) -> str:
    if info.jobs:
        return f"in use by {info.jobs} running job(s)"
    if info.kind == "kept":
        return "kept (keep: true), unused"
    if info.until is None:
        return "unused"
    if info.until <= now:
        return "linger over: `monarch cache drop --expired` removes it"
    return f"lingering until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.until))}"


def ls(places: list[str], out: TextIO) -> int:
    """One line per shared set or kept tier of the user in ``places``."""
    now = time.time()
    sets = _sets(places)
    if not sets and not _kept_stores(places):
        out.write(f"no shared or kept copies of yours in {', '.join(places) or '(no base)'}\n")
        return 0
    for info in sets:
        roots = f"  ({', '.join(info.roots)})" if info.roots else ""
        out.write(f"{info.kind:<7}{info.path}  {info.files} files, {human(info.bytes)}; {_state(info, now)}{roots}\n")
    for path, files, size, until, used in _kept_stores(places):
        state = ("in use by a running job" if used else "linger over: `monarch cache drop --expired` removes it"
                 if until is not None and until <= now else
                 f"lingering until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(until))}" if until else "unused")
        out.write(f"written {path}  {files} files, {human(size)}; {state} (published files kept for the next run: "
                  f"writeback.keep)\n")
    return 0


def _kept_stores(places: list[str]) -> list[tuple]:
    from monarch.writeback.kept import describe
    found = []
    for base in places:
        try:
            one = describe(base)
        except (MonarchError, OSError):  # a base that is not there, or not the user's
            continue
        if one is not None:
            found.append(one)
    return found


def drop(places: list[str], paths: list[str], expired: bool, out: TextIO) -> int:
    """Remove the user's unused sets in ``places`` (only ``paths`` of them if given; with
    ``expired`` only shared sets whose linger is over). Says what went and what stayed, why."""
    now = time.time()
    wanted = {os.path.realpath(p) for p in paths}
    sets = _sets(places, notice=expired)
    if wanted:
        unknown = wanted - {s.path for s in sets} - {k[0] for k in _kept_stores(places)}
        for path in sorted(unknown):
            out.write(f"{path}: not a shared or kept copy set of yours in {', '.join(places)}; "
                      "`monarch cache ls` lists them\n")
        sets = [s for s in sets if s.path in wanted]
    for info in sets:
        if expired and (info.kind != "shared" or info.until is None or info.until > now):
            continue
        why = drop_set(info.path)
        if why is None:
            out.write(f"removed {info.path} ({info.files} files, {human(info.bytes)})\n")
        else:
            out.write(f"kept {info.path}: {why}\n")
    from monarch.writeback.kept import drop as drop_kept
    for path, files, size, until, _ in _kept_stores(places):
        if (wanted and path not in wanted) or (expired and (until is None or until > now)):
            continue
        why = drop_kept(os.path.dirname(os.path.dirname(path)))
        out.write(f"removed {path} ({files} files, {human(size)})\n" if why is None else f"kept {path}: {why}\n")
    return 0


def drop_dataset(roots: list[str], config: Config | None = None) -> list[str]:
    """Remove this user's shared sets of the dataset ``roots`` (which must still exist) in the
    tier bases of ``config`` (the shipped one if None) that no job uses: what a demo or a
    benchmark leaves, at its end. The paths removed."""
    from monarch.config import load_config
    from monarch.node.tiers.shared_set import set_dir
    if config is None:
        config = load_config(None, check_roots=False)
    gone = []
    for base in bases(config, None):
        try:
            path = set_dir(base, tuple(roots))
        except (MonarchError, OSError):
            continue
        if os.path.isdir(path) and drop_set(path) is None:
            gone.append(path)
    return gone

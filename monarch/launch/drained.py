"""What ``monarch drain`` says of each area it drained (monarch/writeback/across.py's ``Drained``):
on stdout what was published and removed, on stderr what is kept and where each unpublished
file's bytes are."""

from __future__ import annotations

import sys

# why a drain may find nothing: said with it, so that an empty drain is not read as "all published"
NOTHING_LEFT = ("no run left write-back files there (each run published its own, or the tier was emptied: a "
                "node lost with its tier holds nothing, and under fsync: partner its partner node published what "
                "it held: see that run's report)")


def say_drained(d) -> bool:
    """What one area's drain published, or what it could not and where those bytes are kept
    (monarch/writeback/across.py's ``Drained``). True when it drained completely."""
    for node, held in d.held.items():
        say_held(d.path, node, held)
    if d.error is not None:
        print(f"monarch drain: {d.path}: cannot drain it: {d.error}; kept", file=sys.stderr)
        return False
    out = d.outcome
    done = (f"published {len(out.published)} files, {out.published_bytes} bytes to the PFS" if out
            else "nothing recorded")
    if d.removed:
        print(f"{d.path}: {done}; removed")
    elif d.complete:
        print(f"{d.path}: {done}; kept: {d.never_closed} file(s) its job never closed, in {d.path}/data "
              f"(rm -r {d.path} once you no longer need them)")
    elif out is None or out.complete:  # what is not whole is a lost node's copy held here, said above
        print(f"monarch drain: {d.path}: kept, with the copies held here that could not all be published",
              file=sys.stderr)
    else:
        why = "; ".join(p for p in (out.failed and f"stopped at {out.failed}", out.damaged) if p)
        print(f"monarch drain: {d.path}: {done}, then {why}", file=sys.stderr)
        for path, kept in out.unpublished.items():
            print(f"monarch drain:   not published: {path} (its bytes are kept in {kept})", file=sys.stderr)
        print(f"monarch drain: {d.path}: kept; run monarch drain again once the PFS takes its files", file=sys.stderr)
    return d.complete


def say_held(path: str, node: int, out) -> None:
    """What a lost node's copies held in ``path`` (its partner's area) published for it."""
    done = f"published {len(out.published)} files, {out.published_bytes} bytes for node {node} (lost with its area)"
    if out.complete:
        print(f"{path}: {done}, from the copies held here")
        return
    why = "; ".join(p for p in (out.failed and f"stopped at {out.failed}", out.damaged) if p)
    print(f"monarch drain: {path}: {done}, then {why}", file=sys.stderr)
    for pfs, kept in out.unpublished.items():
        print(f"monarch drain:   not published: {pfs} (its bytes are kept in {kept})", file=sys.stderr)

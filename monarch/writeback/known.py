"""What the PFS holds under the write-back paths as far as the job's own changes tell, without asking it.

The view checks each change against the PFS as the kernel would (a create's directory, an
unlink's file, an rmdir's emptiness): each check a PFS call on the job's path, where a metadata
call costs a round trip to a metadata server. Most of those paths are the job's own: files it
published, directories it made, checkpoints it removes a few saves later. Once the drain applied
a change, its result is known here: a file published, a name removed, a directory made (and,
when the job made it where nothing was, all it holds: what the job put there since). A path not
known is looked at on the PFS, as before; a directory it showed is remembered (the PFS's own
directories do not come and go under a job, but by the job's changes, which are followed here).
What is known can be wrong only if another process changes the job's own paths while it runs
(the same race a direct job has); the drain's own call then fails, said and kept, never a wrong
file published.

At most ``LIMIT`` paths are known: beyond, everything is forgotten (and looked at again).
"""

from __future__ import annotations

import os

LIMIT = 200_000
FILE, DIR, ABSENT = "file", "dir", "absent"


def _under(path: str, directory: str) -> bool:
    return path.startswith(directory + "/")


class KnownPfs:
    """PFS paths known from the job's applied changes (not thread-safe: the view's lock holds it)."""

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}   # path -> FILE, DIR or ABSENT
        self._whole: set[str] = set()      # directories the job made where nothing was: every name in them known
        self._fresh: set[str] = set()      # directories the job is making where the PFS had nothing

    def kind(self, path: str) -> str | None:
        """FILE, DIR or ABSENT if known, else None (look at the PFS)."""
        k = self._kinds.get(path)
        if k is None and os.path.dirname(path) in self._whole:
            return ABSENT
        return k

    def names(self, directory: str) -> list[str] | None:
        """Every name in ``directory`` if all are known, else None."""
        if directory not in self._whole:
            return None
        return [os.path.basename(p) for p, k in self._kinds.items()
                if k != ABSENT and os.path.dirname(p) == directory]

    def seen_dir(self, path: str) -> None:
        """The PFS showed a directory at ``path`` (not one the job made: what it holds is not known)."""
        self._set(path, DIR)

    def making(self, path: str) -> None:
        """The job makes a directory at ``path``, where the PFS has nothing (the view looked)."""
        self._fresh.add(path)

    def applied(self, op: str, args: dict) -> None:
        """The drain made this record's change on the PFS."""
        if op == "close":
            self._set(args["path"], FILE)
        elif op == "sync":
            self._set(args["path"], FILE)
        elif op == "unlink":
            self._set(args["path"], ABSENT)
        elif op == "mkdir":
            path = args["path"]
            self._set(path, DIR)
            if path in self._fresh:
                self._fresh.discard(path)
                self._whole.add(path)
        elif op == "rmdir":
            self._forget_below(args["path"])
            self._set(args["path"], ABSENT)
        elif op == "rename":
            self._moved(args["src"], args["dst"])

    def _set(self, path: str, kind: str) -> None:
        if len(self._kinds) >= LIMIT and path not in self._kinds:
            self._kinds.clear()
            self._whole.clear()
        self._kinds[path] = kind

    def _forget_below(self, directory: str) -> None:
        for p in [p for p in self._kinds if _under(p, directory)]:
            del self._kinds[p]
        self._whole = {d for d in self._whole if d != directory and not _under(d, directory)}

    def forget(self, path: str) -> None:
        """The kernel changes ``path`` itself (a link, a symlink, a node made there): not known."""
        self._forget_below(path)
        self._kinds.pop(path, None)
        self._whole.discard(os.path.dirname(path))

    def _moved(self, src: str, dst: str) -> None:
        kind = self.kind(src)
        self._forget_below(dst)  # (a rename over an empty directory)
        moved = {dst + p[len(src):]: k for p, k in self._kinds.items() if _under(p, src)}
        whole = {dst + d[len(src):] for d in self._whole if d == src or _under(d, src)}
        self._forget_below(src)
        self._kinds.pop(dst, None)
        for p, k in moved.items():
            self._set(p, k)
        self._whole |= whole
        if kind not in (None, ABSENT):
            self._set(dst, kind)
        else:  # something the job found there: what, is the PFS's to say
            self._whole.discard(os.path.dirname(dst))
        self._set(src, ABSENT)

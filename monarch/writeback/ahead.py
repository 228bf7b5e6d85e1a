"""What the drain makes ready on the PFS before the job waits for it (docs/consistency.md, W2 and W5).

Under ``fsync: pfs`` a job's fsync waits for the drain, and a direct job pays a file's create at
its open, not at its fsync. So the drain makes each file's temporary (drain.temporary_name) at
the file's open (its ``open`` record, in journal order: after the ``mkdir`` of its directory),
while the job writes; the fsync then waits for the bytes and a rename in the directory. A
temporary no publish takes (the file removed, moved to another directory, never closed) is
removed when the drain applies that, and the rest when the run ends; a drain resumed after a
crash removes what a killed run made (drain._left_ahead). Once an fsync's copy renamed a temporary
over its name it stays open, for the copy that follows (the close's, or the next fsync's): in
place, with no open by name.

The directories the drain works in are kept open (``O_PATH``): a name in one is one lookup on
the PFS's metadata service, not a walk of its whole path. One the job renames or removes is
forgotten, with all below it, before the drain applies that. (Another process renaming the job's
directories while it runs races with it: the drain then writes where the directory went.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

AHEAD_MOST = 64  # temporaries held at once (two descriptors each); past it, a file's is made at its publish
DIRS_KEPT = 64   # directories kept open; past it, all are let go and opened again as needed
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class Dirs:
    """The PFS directories the drain works in, open (its thread's alone)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def fd(self, directory: str) -> int:
        """``directory``'s descriptor, kept here (the caller's until the next record: ``trim``):
        opened in its parent's where that is kept, else by its path."""
        fd = self._fds.get(directory)
        if fd is None:
            parent, name = os.path.split(directory)
            above = self._fds.get(parent) if name else None
            fd = os.open(name, DIR_FLAGS, dir_fd=above) if above is not None else os.open(directory or "/", DIR_FLAGS)
            self._fds[directory] = fd
        return fd

    def at(self, path: str) -> tuple[int, str]:
        """(its directory's descriptor, its name): for the ``*at`` calls."""
        directory, name = os.path.split(path)
        return self.fd(directory), name

    def trim(self) -> None:
        """Before a record: no more than DIRS_KEPT kept."""
        if len(self._fds) > DIRS_KEPT:
            self.close()

    def forget(self, path: str) -> None:
        """``path`` and every directory below it: the job renames or removes it."""
        for d in [d for d in self._fds if d == path or d.startswith(path + "/")]:
            os.close(self._fds.pop(d))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


@dataclass
class Ahead:
    """A file's temporary, made on the PFS at its open: open for writing."""
    path: str   # the file's path as the drain has applied the job's changes so far
    dirfd: int  # its directory on the PFS (its own descriptor; -1: none): the temporary's and the rename's
    fd: int
    name: str   # the temporary's name in that directory
    mode: int   # the mode it was made with (the job's at its open, under the daemon's umask)
    placed: bool = False  # renamed over its name by an fsync's copy: the file itself, kept open for the next copy

    def usable(self, path: str, before: tuple | None) -> bool:
        """Can a copy of the file, at ``path`` now, go to it? A temporary: renamed over ``path``, in
        its directory, where no fsync's copy is there yet; placed: written over, where it is that copy."""
        if self.placed:
            return before is not None and self.path == path
        return before is None and os.path.dirname(path) == os.path.dirname(self.path)

    def place(self, path: str, mode: int) -> None:
        """The file itself at ``path`` now (renamed over it, or written there), with ``mode``."""
        self.path, self.name, self.mode, self.placed = path, os.path.basename(path), mode, True

    def moved(self, path: str) -> None:
        """The file is at ``path`` now (the job renamed it, or a directory above it)."""
        self.path = path
        if self.placed:
            self.name = os.path.basename(path)

    def let_go(self, remove: bool | None = None) -> None:
        """Closed; a temporary removed (``remove``: False where it is a spill's own; a placed file never)."""
        if self.fd < 0:
            return
        remove = not self.placed if remove is None else remove and not self.placed
        os.close(self.fd)
        self.fd = -1
        try:
            if remove:
                os.unlink(self.name, dir_fd=self.dirfd)
        except OSError:
            pass  # (gone already)
        finally:
            if self.dirfd >= 0:
                os.close(self.dirfd)


class Aheads:
    """The temporaries made ahead (file -> Ahead) and the directories kept. The drain's thread
    makes and follows them; another thread may only ``take`` one (a dict's pop: atomic)."""

    def __init__(self) -> None:
        self.files: dict[int, Ahead] = {}
        self.dirs = Dirs()

    def make(self, seq: int, path: str, name: str, mode: int, umask: int) -> None:
        """File ``seq``'s temporary ``name`` beside ``path``, made with ``mode`` (O_EXCL: one a spill
        made first is its writer's). Not made past AHEAD_MOST, or where the PFS refuses: the
        publish then makes its own, and meets the refusal there."""
        if len(self.files) >= AHEAD_MOST:
            return
        mode &= 0o777  # (set-id bits: by the publish's chmod)
        try:
            dirfd = os.dup(self.dirs.fd(os.path.dirname(path)))
        except OSError:
            return
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
        except OSError:
            os.close(dirfd)
            return
        self.files[seq] = Ahead(path, dirfd, fd, name, mode & ~umask)

    def take(self, seq: int) -> Ahead | None:
        return self.files.pop(seq, None)

    def hand_over(self, seq: int) -> None:
        """File ``seq`` is written through from now (a spill, another thread's): its temporary, if
        made, is its writer's; the drain holds no descriptor of it."""
        ahead = self.take(seq)
        if ahead is not None:
            ahead.let_go(remove=False)

    def keep(self, seq: int, ahead: Ahead) -> bool:
        """File ``seq``'s ``ahead`` held for its next copy; False (the caller lets it go) past AHEAD_MOST."""
        if len(self.files) >= AHEAD_MOST:
            return False
        self.files[seq] = ahead
        return True

    def follow(self, op: str, args: dict) -> None:
        """Before the drain applies a rename, a removal, a ``drop`` or a ``rmdir``: a file renamed in
        its directory, or a directory renamed, is followed; a file removed lets its temporary go;
        a directory removed, every temporary in it (a file moved away before its close: the close
        names its new path); the directories it names are forgotten."""
        if op == "rename":
            src, dst = args["src"], args["dst"]
            self.dirs.forget(src)
            self.dirs.forget(dst)
            for seq, ahead in list(self.files.items()):
                if ahead.path == src and os.path.dirname(src) == os.path.dirname(dst):
                    ahead.moved(dst)
                elif ahead.path == src:
                    self.let_go(seq)
                elif ahead.path.startswith(src + "/"):
                    ahead.moved(dst + ahead.path[len(src):])
        elif op == "unlink":
            self.let_go(where=lambda p: p == args["path"])
        elif op == "drop":  # (removed while being written: never closed)
            self.let_go(args["seq"])
        elif op == "rmdir":
            self.dirs.forget(args["path"])
            self.let_go(where=lambda p: os.path.dirname(p) == args["path"])

    def let_go(self, seq: int | None = None, where=None) -> None:
        """The temporary of file ``seq``, or those whose path ``where(path)`` picks: removed."""
        for s in [seq] if seq is not None else list(self.files):
            ahead = self.files.get(s)
            if ahead is not None and (seq is not None or where(ahead.path)) and self.files.pop(s, None) is ahead:
                ahead.let_go()  # (by whoever took it from the dict: a spill's thread may take one meanwhile)

    def close(self) -> None:
        """The run's end: every temporary left removed, every directory let go."""
        self.let_go(where=lambda p: True)
        self.dirs.close()

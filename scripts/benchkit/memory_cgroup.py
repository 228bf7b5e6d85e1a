"""A memory cgroup for a benchmark's reader: a node whose memory is far smaller than the data.

Its page cache cannot hold the dataset for direct reads; a tier the daemon writes is outside
it. cgroup v2 or v1; not root, or no memory controller: none, said once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


class MemoryCgroup:
    """A memory cgroup of ``limit`` bytes named after ``name`` and this process."""

    def __init__(self, limit: int, name: str):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        name = f"{name}-{os.getpid()}"
        if v2.exists() and "memory" in v2.read_text():
            self.path, limit_file = Path("/sys/fs/cgroup") / name, "memory.max"
        else:
            self.path, limit_file = Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"
        try:
            self.path.mkdir()
            (self.path / limit_file).write_text(str(limit))
        except OSError as e:
            print(f"no memory cgroup ({e}): direct reads are flattered by the page cache", file=sys.stderr)
            self.path = None

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the cgroup (as it is when there is none)."""
        if self.path is None:
            return cmd
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass  # a process still in it: the kernel keeps it until then

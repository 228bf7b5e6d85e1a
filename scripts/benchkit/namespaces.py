"""Simulated nodes on one host, each with a page cache of its own: a mount namespace per node
holding its own FUSE mount of the emulated PFS at the same path.

Real nodes do not share a page cache: what one node's client read of the PFS, another's reads
again. Simulated nodes sharing one FUSE mount would share its page cache, and the PFS would be
read less than on a cluster. So each node is a persistent mount namespace (``unshare
--mount=FILE``), in which that node's FUSE server (``monarch.tools.slowpfs``, counting its own
bytes) mounts the PFS at the path every node uses; its daemon and its readers enter it
(``nsenter --mount=FILE``). The PFS's bytes are the sum of the mounts' counts. Needs root.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

MOUNT_WAIT_S = 30.0


class NodeNamespaces:
    """``nodes`` mount namespaces under ``base`` (``ns<k>``), each with the emulated PFS of
    ``src`` mounted at ``mountpoint``; ``slowpfs_args``: its options (latency, bandwidth)."""

    def __init__(self, base: Path, nodes: int, src: Path, mountpoint: Path, slowpfs_args: list[str]):
        self.base, self.nodes, self.src, self.mountpoint = base, nodes, src, mountpoint
        self.args = slowpfs_args
        self.servers: list[subprocess.Popen] = []
        self.made: list[Path] = []

    def ns(self, k: int) -> Path:
        return self.base / f"ns{k}"

    def counters(self, k: int) -> Path:
        return self.base / f"pfs{k}.json"

    def enter(self, k: int, cmd: list[str]) -> list[str]:
        """``cmd`` run in node ``k``'s mount namespace."""
        return ["nsenter", f"--mount={self.ns(k)}", "--", *cmd]

    def enter_by_rank(self, cmd: list[str]) -> list[str]:
        """``cmd`` run by an MPI rank in the namespace of its node (its rank)."""
        rank = "${PMI_RANK:-${OMPI_COMM_WORLD_RANK}}"
        return ["sh", "-c", f'exec nsenter --mount={self.base}/ns{rank} -- "$@"', "sh", *cmd]

    def __enter__(self) -> "NodeNamespaces":
        self.base.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        # a namespace is kept by a bind mount of a file, on a private mount (else it propagates)
        subprocess.run(["mount", "--bind", str(self.base), str(self.base)], check=True)
        subprocess.run(["mount", "--make-private", str(self.base)], check=True)
        try:
            for k in range(self.nodes):
                self.ns(k).touch()
                subprocess.run(["unshare", f"--mount={self.ns(k)}", "--propagation", "private", "true"], check=True)
                self.made.append(self.ns(k))
                self.servers.append(subprocess.Popen(
                    self.enter(k, [sys.executable, "-m", "monarch.tools.slowpfs", str(self.src), str(self.mountpoint),
                                   "--counters", str(self.counters(k)), *self.args]),
                    stdout=subprocess.DEVNULL, stderr=open(self.base / f"pfs{k}.log", "w"), start_new_session=True))
            for k in range(self.nodes):
                self._wait_mounted(k)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_mounted(self, k: int) -> None:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while time.monotonic() < deadline:
            r = subprocess.run(self.enter(k, ["findmnt", "-n", str(self.mountpoint)]), capture_output=True)
            if r.returncode == 0:
                return
            if self.servers[k].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"node {k}'s emulated PFS did not mount; see {self.base}/pfs{k}.log")

    def pfs_bytes(self, name: str | None = None) -> int:
        """The bytes the nodes' mounts served (of file ``name`` only, if given), summed."""
        total = 0
        for k in range(self.nodes):
            time.sleep(0.02)  # (each server writes its counts every 10 ms)
            c = json.loads(self.counters(k).read_text())
            total += c["bytes"] if name is None else c["files"].get(name, {}).get("bytes", 0)
        return total

    def __exit__(self, *exc: object) -> None:
        for k, server in enumerate(self.servers):
            subprocess.run(self.enter(k, ["fusermount3", "-u", "-z", str(self.mountpoint)]), capture_output=True)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        for ns in self.made:
            subprocess.run(["umount", str(ns)], capture_output=True)
        subprocess.run(["umount", str(self.base)], capture_output=True)
        self.servers, self.made = [], []

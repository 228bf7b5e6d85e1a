"""Every process shape over one mapping of a cluster's large file made before its blocks are
local (its blocks guarded: monarch/shim/shim_guard.c), each checked against the source's bytes:

* ``os.write`` of the mapping's pages straight to a file (the kernel reads them: no fault);
* four threads, each reading a quarter in its own order;
* a fork child reading the second half through the inherited mapping;
* a child process that maps the file, enables ``faulthandler`` (a SIGSEGV handler of its own)
  and then really faults: the application's handler runs, and the process dies of SIGSEGV as
  it would without Monarch.

Prints one JSON line: what each shape found."""

import argparse
import hashlib
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading

SEGFAULT = r"""
import ctypes, faulthandler, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
faulthandler.enable()
assert len(m[:4096]) == 4096
ctypes.string_at(0)  # a real fault: faulthandler's, then the default action
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--source", required=True, help="the same file, read without Monarch's help")
    args = p.parse_args()
    with open(args.source, "rb") as f:
        want = f.read()
    size = len(want)
    fd = os.open(args.path, os.O_RDONLY)
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    view = memoryview(m)
    out = {}

    # the kernel reads the mapping: a write straight from its pages (its last 12 MiB, staged last)
    with tempfile.TemporaryFile() as t:
        step, tail = 3 << 20, size - (12 << 20)
        for off in range(tail, size, step):
            assert os.write(t.fileno(), view[off:off + step]) == step
        t.seek(0)
        out["write"] = t.read() == want[tail:]

    # threads, each its own quarter, backwards
    quarter = size // 4
    found = [None] * 4

    def read_quarter(k):
        lo, hi = k * quarter, (k + 1) * quarter
        parts = {off: bytes(view[off:min(off + (1 << 20), hi)]) for off in reversed(range(lo, hi, 1 << 20))}
        found[k] = b"".join(parts[off] for off in sorted(parts)) == want[lo:hi]

    threads = [threading.Thread(target=read_quarter, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()

    # a fork child, while the threads run: the second half through the inherited mapping
    pid = os.fork()
    if pid == 0:
        ok = hashlib.sha256(view[size // 2:]).digest() == hashlib.sha256(want[size // 2:]).digest()
        os._exit(0 if ok else 3)
    for t in threads:
        t.join()
    _, status = os.waitpid(pid, 0)
    out["threads"] = all(found)
    out["fork"] = os.waitstatus_to_exitcode(status)
    out["whole"] = view[:] == want

    # the application's own SIGSEGV handler, and its death by SIGSEGV
    seg = subprocess.run([sys.executable, "-c", SEGFAULT, args.path], capture_output=True, text=True, timeout=60)
    out["segfault"] = {"returncode": seg.returncode, "faulthandler": "Segmentation fault" in seg.stderr}
    view.release()
    m.close()
    os.close(fd)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

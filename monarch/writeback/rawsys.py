"""Can this job's raw system calls be watched? Asked once, by the launcher, before the job runs.

Write-back changes what a path means: a checkpoint lives in the node's tier until it is drained.
A library that calls the kernel without libc (safetensors' rustix renames its temporary by a raw
``renameat``) reaches the PFS instead and misses it, unless the shim watches raw calls through
Linux's syscall user dispatch (monarch/shim/shim_rawsys.c). Where the dispatch cannot work (a
kernel before 5.11, an architecture without it, a seccomp filter that refuses its ``prctl``) or
the user turned the watch off (``MONARCH_SHIM_RAW_SYSCALLS=0``), the whole job writes through:
every file under the write-back paths goes to the PFS as without Monarch, in every process of the
job (never half of them: the job's order would break), said once on stderr and in the report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from monarch.protocol import ENV_RAW_SYSCALLS

PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, PR_SYS_DISPATCH_ON = 59, 0, 1
DISPATCH_ARCHES = ("x86_64",)  # where the shim watches raw calls (Linux's generic entry code has the dispatch)


def unwatched_reason(env: dict[str, str] | None = None) -> str | None:
    """Why a job started from this process could not have its raw system calls watched (None: it can)."""
    env = os.environ if env is None else env
    if env.get(ENV_RAW_SYSCALLS, "") == "0":
        return f"{ENV_RAW_SYSCALLS}=0 turned the watch on raw system calls off"
    arch = platform.machine()
    if arch not in DISPATCH_ARCHES:
        return f"the kernel has no syscall user dispatch on {arch} (Linux has it on x86_64 from 5.11)"
    refused = _dispatch_refused()
    if refused:
        return f"the kernel refused syscall user dispatch ({refused}: a kernel before 5.11, or a seccomp filter)"
    return None


def _dispatch_refused() -> str | None:
    """Turn the dispatch on for this thread and off again (its selector says ALLOW throughout, so no
    call of this thread is ever dispatched meanwhile): None, or the kernel's error."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    selector = ctypes.c_char(b"\0")  # SYSCALL_DISPATCH_FILTER_ALLOW
    ulong = ctypes.c_ulong
    if libc.prctl(PR_SET_SYSCALL_USER_DISPATCH, ulong(PR_SYS_DISPATCH_ON), ulong(0), ulong(0),
                  ctypes.byref(selector)) != 0:
        return os.strerror(ctypes.get_errno())
    libc.prctl(PR_SET_SYSCALL_USER_DISPATCH, ulong(PR_SYS_DISPATCH_OFF), ulong(0), ulong(0), ulong(0))
    return None


# the system calls a raw call is likely to be, by number (the report's names; others: "syscall N")
CALL_NAMES = {"x86_64": {0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat", 8: "lseek",
                         9: "mmap", 10: "mprotect", 11: "munmap", 13: "rt_sigaction", 14: "rt_sigprocmask",
                         17: "pread64", 18: "pwrite64", 21: "access", 24: "sched_yield", 39: "getpid",
                         74: "fsync", 75: "fdatasync", 82: "rename", 83: "mkdir", 84: "rmdir", 87: "unlink",
                         186: "gettid", 202: "futex", 217: "getdents64", 228: "clock_gettime", 230: "clock_nanosleep",
                         257: "openat", 262: "newfstatat", 263: "unlinkat", 264: "renameat", 316: "renameat2",
                         332: "statx", 439: "faccessat2"}}


def raw_calls(words: tuple[int, ...], by_call_at: int, pairs: int) -> dict[str, int]:
    """The counters' (number + 1, calls) pairs as {name: calls}, most first."""
    names = CALL_NAMES.get(platform.machine(), {})
    out = {}
    for i in range(pairs):
        key, calls = words[by_call_at + 2 * i], words[by_call_at + 2 * i + 1]
        if key:
            out[names.get(key - 1, f"syscall {key - 1}")] = calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

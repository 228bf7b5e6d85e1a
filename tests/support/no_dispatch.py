"""Run a command as on a kernel without syscall user dispatch: ``python3 no_dispatch.py CMD ARGS...``.

A seccomp filter (inherited by every child, kept across exec) answers
``prctl(PR_SET_SYSCALL_USER_DISPATCH, ...)`` with EINVAL, as Linux before 5.11 does (RHEL 8's 4.18)
and as arm64 does; every other call is allowed.
"""

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PR_SET_SYSCALL_USER_DISPATCH, EINVAL = 59, 22
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# audit arch, prctl's number
ARCH = {"x86_64": (0xC000003E, 157), "aarch64": (0xC00000B7, 167)}
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06


def program() -> bytes:
    audit, prctl = ARCH[platform.machine()]
    ops = [(LD_ABS_W, 0, 0, 4),          # seccomp_data.arch
           (JEQ_K, 0, 5, audit),         # another ABI (x32, i386): allowed
           (LD_ABS_W, 0, 0, 0),          # .nr
           (JEQ_K, 0, 3, prctl),
           (LD_ABS_W, 0, 0, 16),         # .args[0], its low half
           (JEQ_K, 0, 1, PR_SET_SYSCALL_USER_DISPATCH),
           (RET_K, 0, 0, SECCOMP_RET_ERRNO | EINVAL),
           (RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    return b"".join(struct.pack("HBBI", *op) for op in ops)


def install() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(program())

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Fprog(len(code.raw) // 8, ctypes.cast(code, ctypes.c_void_p))
    ulong = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0 or \
            libc.prctl(PR_SET_SECCOMP, ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), ulong(0), ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter not installed")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])

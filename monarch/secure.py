"""Safe on a shared node: the one place that creates Monarch's directories and files.

Other users share ``/tmp``, ``/dev/shm`` and the node. Every directory Monarch makes in a
shared place is created 0700 by the user and checked after creation (a directory, not a
symlink, owned by the user, writable by no one else); an existing one that fails the check
is refused with an error that says what is wrong and how to fix it. Files are created with
``O_EXCL | O_NOFOLLOW``, so a planted file or symlink is never written through.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import struct

from monarch.errors import MonarchError

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(MonarchError):
    """A directory Monarch would use is not private to this user."""


def check_private_dir(path: str) -> os.stat_result:
    """``path`` is a real directory of ours that no one else can write or enter."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise UnsafePathError(f"{path}: cannot check it: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink, not a directory Monarch made; remove it "
                              "(someone may be trying to redirect Monarch's files)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} exists and is not a directory; remove it or configure another path")
    if st.st_uid != os.getuid():
        raise UnsafePathError(f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                              "another user made it first: configure another path (run_dir, tiers[].path)")
    if st.st_mode & 0o077:
        raise UnsafePathError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; Monarch's directories must be "
                              f"private (0700): chmod 700 {path}, or remove it")
    return st


def private_dir(path: str) -> str:
    """Create ``path`` (one level) 0700 if missing, then check it is private; return it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise UnsafePathError(f"{path}: cannot create it: {e.strerror}") from None
    check_private_dir(path)
    return path


def check_base(base: str) -> None:
    """A base may be shared (``/tmp``, ``/dev/shm``) but not open to renames by others:
    owned by the user or root, and sticky if others may write it."""
    try:
        st = os.stat(base)
    except OSError as e:
        raise UnsafePathError(f"{base}: cannot use it as a base directory: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{base} is not a directory; configure a directory as the base path")
    if st.st_uid not in (0, os.getuid()):
        raise UnsafePathError(f"{base} is owned by uid {st.st_uid}: another user could replace Monarch's "
                              "files there; configure a base directory of yours (or /tmp, /dev/shm)")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(f"{base} is writable by others without the sticky bit (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}); use a private or sticky base such as /tmp")


def user_dir(base: str) -> str:
    """``<base>/monarch-<uid>``: this user's private directory under a shared base.

    A missing base is created (0700); Monarch never removes a base.
    """
    try:
        os.makedirs(base, 0o700, exist_ok=True)
    except OSError as e:
        raise UnsafePathError(f"{base}: cannot create it: {e.strerror}; configure another base path") from None
    check_base(base)
    return private_dir(os.path.join(base, f"monarch-{os.getuid()}"))


def new_private_dir(parent: str, prefix: str) -> str:
    """A fresh 0700 directory with an unpredictable name inside a private ``parent``."""
    for _ in range(100):
        path = os.path.join(parent, f"{prefix}{secrets.token_hex(4)}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise UnsafePathError(f"{parent}: cannot make a new directory there")


def create_exclusive(path: str, mode: int = 0o600) -> int:
    """A new file opened for writing; fails if anything (a file, a symlink) is already there."""
    return os.open(path, CREATE_FLAGS, mode)


def write_file_atomically(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to a fresh temporary name beside ``path`` and rename it over ``path``."""
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    fd = create_exclusive(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def open_private_file(path: str, flags: int = os.O_RDWR, mode: int = 0o600) -> int:
    """Open ``path`` (creating it if missing) without following a symlink, and check it is ours."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise UnsafePathError(f"{path} is not a regular file of yours; remove it")
    return fd


def owner_only(mode: int) -> int:
    """A staged copy's permission bits: the source's, masked to the owner (never more readable)."""
    return stat.S_IMODE(mode) & 0o700 | 0o600


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def peer_is_me(sock: socket.socket) -> bool:
    """Is the Unix-socket peer of this uid? (False when the kernel cannot say.)"""
    try:
        return peer_uid(sock) == os.getuid()
    except OSError:
        return False


def check_peer_is_me(sock: socket.socket) -> None:
    """Refuse a Unix-socket peer of another uid (SO_PEERCRED)."""
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise UnsafePathError(f"the process at the other end of the socket runs as uid {uid}, not {os.getuid()}")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

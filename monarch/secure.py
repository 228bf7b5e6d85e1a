"""Safe on a shared node: the one place that creates Monarch's directories and files.

Other users share ``/tmp``, ``/dev/shm`` and the node. Every directory Monarch makes in a
shared place is created 0700 by the user and checked after creation (a directory, not a
symlink, owned by the user, writable by no one else); an existing one that fails the check
is refused with an error that says what is wrong and how to fix it. Files are created with
``O_EXCL | O_NOFOLLOW``, so a planted file or symlink is never written through.

A configured base (``run_base``, ``tiers[].path``, ``peer.path``) is resolved once, each
component checked (``open_base``), and used by its real path from then on: no other user
can redirect it, before the check or after. A base must exist.
"""

from __future__ import annotations

import os
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
    return _check_private(path, st)


def _check_private(path: str, st: os.stat_result) -> os.stat_result:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink, not a directory Monarch made; remove it "
                              "(someone may be trying to redirect Monarch's files)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} exists and is not a directory; remove it or configure another path")
    if st.st_uid != os.getuid():
        raise UnsafePathError(f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                              "another user made it first: configure another path (run_base, tiers[].path)")
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


class UnsafeBaseError(UnsafePathError):
    """A configured base directory (``run_base``, ``tiers[].path``, ``peer.path``) that cannot be used."""


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # as the kernel's limit on symlinks followed in one lookup


def _controlled_by_others(st: os.stat_result) -> str | None:
    """Why another user could change what a component of a base leads to, or None."""
    if st.st_uid not in (0, os.getuid()):
        return f"owned by uid {st.st_uid}, another user"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _where(base: str, here: str) -> str:
    """The component a message is about: the base itself, or one on its way."""
    return base if here == os.path.abspath(base) else f"{base}: {here}"


def _walk(base: str, path: str) -> tuple[str, int | None]:
    """Walk absolute ``path`` from ``/`` through directory descriptors, checking each component.

    Returns (the real path, an O_PATH descriptor of it) when every component is a directory,
    or (the path to walk next, None) at the first symlink: its target (relative to the
    directories walked so far, ``..`` applied by name) followed by the rest of ``path``.
    """
    fd = os.open("/", _DIR_FLAGS)
    done = "/"
    try:
        why = _controlled_by_others(os.fstat(fd))
        if why:
            raise UnsafeBaseError(f"{base}: / is {why}; Monarch cannot use a base on this node")
        parts = [p for p in path.split("/") if p]
        for i, name in enumerate(parts):
            here = os.path.join(done, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                on_the_way = (os.path.abspath(base) + "/").startswith(here + "/")  # else: in a link's target
                missing = base if on_the_way else f"{base} ({here})"
                raise UnsafeBaseError(f"{missing} does not exist; create it or fix the path") from None
            except OSError as e:
                raise UnsafeBaseError(f"{_where(base, here)}: cannot check it: {e.strerror}") from None
            why = _controlled_by_others(st)
            if why:
                what = "a symlink " if stat.S_ISLNK(st.st_mode) else ""
                raise UnsafeBaseError(f"{_where(base, here)} is {what}{why}: they could redirect Monarch's files; "
                                      "configure a base whose every directory and symlink is yours or root's "
                                      "(such as /tmp, /dev/shm)")
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=fd)
                return os.path.normpath(os.path.join(done, target, *parts[i + 1:])), None
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeBaseError(f"{_where(base, here)} is not a directory; configure a directory as the base")
            nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # replaced between the check and the open
                raise UnsafeBaseError(f"{_where(base, here)} changed while Monarch checked it; try again")
            done = here
    except BaseException:
        os.close(fd)
        raise
    return done, fd


def open_base(base: str) -> tuple[str, int]:
    """A configured base directory, resolved once: its real path and an O_PATH descriptor of it.

    Like OpenSSH's safe_path: every component from ``/`` (each symlink followed, and the
    link itself) must be owned by this user or root, and every directory on the way
    writable by no one else unless sticky (``/tmp``). Then no other user can redirect
    the path, now or later, and Monarch works through the real path. A base must exist:
    Monarch creates only its own ``monarch-<uid>`` inside.
    """
    path = os.path.abspath(base)
    for _ in range(MAX_LINKS):
        path, fd = _walk(base, path)
        if fd is not None:
            return path, fd
    raise UnsafeBaseError(f"{base}: more than {MAX_LINKS} symlinks to follow; configure its real path")


def resolve_base(base: str) -> str:
    """The real path of a configured base directory, checked (``open_base``)."""
    path, fd = open_base(base)
    os.close(fd)
    return path


def user_dir(base: str) -> str:
    """``<base>/monarch-<uid>``: this user's private directory under a shared base (its real
    path), made through the base's descriptor. The base must exist (``open_base``); Monarch
    never creates nor removes a base."""
    real, fd = open_base(base)
    name = f"monarch-{os.getuid()}"
    path = os.path.join(real, name)
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise UnsafePathError(f"{path}: cannot create it: {e.strerror}") from None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as e:
            raise UnsafePathError(f"{path}: cannot check it: {e.strerror}") from None
    finally:
        os.close(fd)
    _check_private(path, st)
    return path


def new_private_dir(parent: str, prefix: str) -> str:
    """A fresh 0700 directory with an unpredictable name inside a private ``parent``."""
    for _ in range(100):
        path = os.path.join(parent, f"{prefix}{os.urandom(4).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise UnsafePathError(f"{parent}: cannot make a new directory there")


def create_exclusive(path: str, mode: int = 0o600) -> int:
    """A new file opened for writing; fails if anything (a file, a symlink) is already there."""
    return os.open(path, CREATE_FLAGS, mode)


def write_file_atomically(path: str, data: bytes | list, mode: int = 0o600, size: int | None = None) -> None:
    """Write ``data`` (bytes, or a list of buffers written one after the other: no joined
    copy of a large file; an int in the list: that many bytes left a hole) to a fresh temporary
    name beside ``path`` and rename it over ``path``; ``size``: the file that long before the
    rename (a sparse tail: no page written for it)."""
    tmp = f"{path}.tmp-{os.urandom(6).hex()}"
    fd = create_exclusive(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in data if isinstance(data, list) else (data,):
                if isinstance(part, int):
                    f.seek(part, os.SEEK_CUR)
                else:
                    f.write(part)
            if size is not None:
                f.truncate(size)
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

"""A store's address: ``redis://[user@]host[:port][/db][?prefix=P&password_file=F&timeout=S]``,
``rediss://`` (TLS; ``&ca_file=PEM`` trusts a private certificate authority), or
``unix:///path/to/redis.sock[?db=N&prefix=P...]``.

Credentials come only from the environment (``MONARCH_STORE_PASSWORD``) or a file readable
by the user alone (``?password_file=PATH`` or ``MONARCH_STORE_PASSWORD_FILE``); a password
written in the URL itself (which lands in configuration files, command lines and logs) is
refused. ``str(url)`` never shows a password.
"""

from __future__ import annotations

import os
import stat
import urllib.parse
from dataclasses import dataclass, field

from monarch.errors import MonarchError

ENV_PASSWORD = "MONARCH_STORE_PASSWORD"
ENV_PASSWORD_FILE = "MONARCH_STORE_PASSWORD_FILE"
SCHEMES = ("redis", "rediss", "unix")
DEFAULT_TIMEOUT = 5.0  # seconds: a store that does not answer within this is unreachable (bounded waits)


class StoreError(MonarchError):
    """A store cannot be used: unreachable, refused, no manifest, a bad value. One line, the URL named."""


@dataclass(frozen=True)
class StoreURL:
    scheme: str
    host: str = ""
    port: int = 6379
    path: str = ""  # the Unix socket
    db: int = 0
    username: str | None = None
    prefix: str = ""
    password_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    ca_file: str | None = None  # rediss://: the certificate authority to trust (default: the system's)
    text: str = field(default="", compare=False)  # as given (no password: refused)
    has_digests = True  # the manifest holds each value's digest, checked at each copy

    @classmethod
    def parse(cls, text: str) -> "StoreURL":
        u = urllib.parse.urlsplit(text)
        if u.scheme not in SCHEMES:
            raise StoreError(f"{text!r} is not a store URL: expected redis://host:port/db?prefix=..., "
                             "rediss:// (TLS), unix:///path/to/redis.sock?db=0&prefix=... or s3://BUCKET/PREFIX")
        if u.password is not None:
            raise StoreError(f"a store URL may not hold a password ({redact(text)}): set {ENV_PASSWORD}, or "
                             "name a file readable by you alone with ?password_file=PATH or "
                             f"{ENV_PASSWORD_FILE}")
        query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
        known = {"prefix", "db", "password_file", "timeout", "ca_file"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise StoreError(f"{text}: unknown parameter {unknown[0]!r}; known: {', '.join(sorted(known))}")
        q = {k: v[-1] for k, v in query.items()}
        try:
            if u.scheme == "unix":
                if not u.path:
                    raise ValueError("no socket path")
                db = int(q.get("db", 0))
                host, port, path = "", 0, u.path
            else:
                if not u.hostname:
                    raise ValueError("no host")
                db = int(q["db"]) if "db" in q else int(u.path.strip("/") or 0)
                host, port, path = u.hostname, u.port or 6379, ""
            timeout = float(q.get("timeout", DEFAULT_TIMEOUT))
        except ValueError as e:
            raise StoreError(f"{text}: {e}; expected redis://host:port/db, rediss://... or "
                             "unix:///path.sock?db=N") from None
        if timeout <= 0:
            raise StoreError(f"{text}: timeout must be more than 0 seconds")
        if "ca_file" in q and u.scheme != "rediss":
            raise StoreError(f"{text}: ca_file is for TLS: write rediss://")
        return cls(u.scheme, host, port, path, db, urllib.parse.unquote(u.username) if u.username else None,
                   q.get("prefix", ""), q.get("password_file"), timeout, q.get("ca_file"), text)

    def __str__(self) -> str:
        return redact(self.text) if self.text else self.where()

    def where(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}?db={self.db}&prefix={self.prefix}"
        return f"{self.scheme}://{self.host}:{self.port}/{self.db}?prefix={self.prefix}"

    def key(self, rel: str) -> bytes:
        """The store key of a file (its path relative to the dataset's top)."""
        return os.fsencode(self.prefix + rel)

    def password(self, env=None) -> str | None:
        """The password: ``MONARCH_STORE_PASSWORD``, else the first line of the password file
        (``?password_file=`` or ``MONARCH_STORE_PASSWORD_FILE``), which must be a regular file
        of this user that no one else can read; None: no password."""
        env = os.environ if env is None else env
        if env.get(ENV_PASSWORD):
            return env[ENV_PASSWORD]
        path = self.password_file or env.get(ENV_PASSWORD_FILE)
        if not path:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise StoreError(f"{self}: the password file {path} cannot be read: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise StoreError(f"{self}: the password file {path} must be a regular file of yours that no one "
                                 f"else can read or write (chmod 600 {path})")
            with os.fdopen(os.dup(fd), "r") as f:
                return f.readline().rstrip("\r\n")
        finally:
            os.close(fd)


def redact(text: str) -> str:
    """``text`` with any password in a URL replaced by ``***``."""
    try:
        u = urllib.parse.urlsplit(text)
        if u.password is None:
            return text
        netloc = u.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        return urllib.parse.urlunsplit((u.scheme, f"{user}:***@{netloc[1]}", u.path, u.query, u.fragment))
    except ValueError:
        return "<store URL>"

"""Talking to a store over the Redis protocol: a thread-safe client, and one-line messages for
what goes wrong.

The client library is redis-py (``redis`` on PyPI): the Redis project's own Python client,
maintained by Redis with releases every few weeks, pure Python (no build step on the
user's machine), thread-safe through its connection pool, and it speaks RESP to Redis 7,
Valkey, KeyDB and Dragonfly alike, over TCP, TLS or a Unix socket.
"""

from __future__ import annotations

from typing import Any

from monarch.store import s3
from monarch.store.url import StoreError, StoreURL

MAX_CONNECTIONS = 512  # requests in flight at once at most (one per connection)


def _redis():
    try:
        import redis
    except ImportError:
        raise StoreError("a dataset in a key-value store needs the redis client library: "
                         "pip install 'monarch[store]' (or: pip install redis)") from None
    return redis


def parse_url(text: str) -> StoreURL | s3.S3URL:
    """A store URL of any kind: an ``s3://`` bucket (``monarch/store/s3.py``) or a Redis-protocol store."""
    if text.startswith(s3.SCHEME + "://"):
        return s3.S3URL.parse(text)
    return StoreURL.parse(text)


def connect(url: StoreURL, env=None) -> Any:
    """A client of the store (no round trip yet: ``ping`` makes one)."""
    if url.scheme == s3.SCHEME:
        return s3.connect(url)
    redis = _redis()
    common = dict(db=url.db, username=url.username, password=url.password(env),
                  socket_timeout=url.timeout, socket_connect_timeout=url.timeout,
                  max_connections=MAX_CONNECTIONS, health_check_interval=0)
    if url.scheme == "unix":
        pool = redis.ConnectionPool(connection_class=redis.UnixDomainSocketConnection, path=url.path, **common)
    else:
        kind = redis.SSLConnection if url.scheme == "rediss" else redis.Connection
        if url.scheme == "rediss":  # the server's certificate checked, against ca_file or the system's CAs
            common |= {"ssl_cert_reqs": "required", "ssl_ca_certs": url.ca_file}
        pool = redis.ConnectionPool(connection_class=kind, host=url.host, port=url.port, **common)
    return redis.Redis(connection_pool=pool)


def is_connection_error(e: BaseException) -> bool:
    """The store could not be reached or stopped answering (as opposed to refusing a request)."""
    if isinstance(e, s3.S3Error):
        return s3.is_connection_error(e)
    redis = _redis()
    return isinstance(e, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
        e, redis.AuthenticationError)


def explain(url: StoreURL, e: BaseException, password_given: bool | None = None) -> str:
    """One line saying what went wrong with the store at ``url``, and what to do
    (``password_given``: whether a password was sent, when known)."""
    if url.scheme == s3.SCHEME:
        return s3.explain(url, e)
    redis = _redis()
    text = str(e).strip().rstrip(".") or type(e).__name__
    if ("NOAUTH" in text or "Authentication required" in text
            or (password_given is False and isinstance(e, redis.AuthenticationError))):
        return (f"the store at {url} needs a password: set MONARCH_STORE_PASSWORD or name a file readable "
                "by you alone with ?password_file=PATH")
    if isinstance(e, redis.AuthenticationError) or "WRONGPASS" in text or "invalid password" in text.lower():
        return (f"the store at {url} refused the password (WRONGPASS): check MONARCH_STORE_PASSWORD "
                "or the password file")
    if isinstance(e, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return f"the store at {url} is unreachable ({text}); check the URL and that its server runs"
    if isinstance(e, StoreError):
        return str(e)
    return f"the store at {url} failed: {text}"


def ping(url: StoreURL, env=None) -> Any:
    """A client that has answered one PING (raises StoreError, one line, otherwise)."""
    if url.scheme == s3.SCHEME:
        return s3.ping(url)
    client = connect(url, env)
    try:
        client.ping()
    except Exception as e:
        client.close()
        raise StoreError(explain(url, e, client.connection_pool.connection_kwargs.get("password") is not None)) \
            from None
    return client

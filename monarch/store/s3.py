"""A dataset in an S3 bucket: ``s3://BUCKET[/PREFIX][?endpoint=URL&region=R&profile=P&ca_file=PEM&timeout=S]``.

The bucket needs no manifest and no ``monarch store put``: its listing (key, size, ETag,
LastModified) is the snapshot, and each object is served only if it is still the one listed
(every GET carries ``If-Match: <the listed ETag>``; its size is checked too): an object
changed or deleted during the job is refused, never served.

The conventions are the AWS SDKs', resolved by botocore (the SDK's own resolver): the
endpoint from ``?endpoint=``, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` / the
profile's ``endpoint_url``, else AWS's; the region from ``?region=``, ``AWS_REGION``, the
profile; credentials from the environment, ``~/.aws/credentials`` and ``~/.aws/config``
(``?profile=`` or ``AWS_PROFILE``), SSO, roles, the instance's; a CA bundle from
``?ca_file=``, ``AWS_CA_BUNDLE`` or the profile's ``ca_bundle``. A URL holding credentials is
refused; credentials are never printed, logged or written anywhere: messages name where they
came from (``env``, ``shared-credentials-file``), never what they are.

The bytes move through obstore (the Rust ``object_store`` crate's Python binding), chosen by
measurement (commit message of its introduction): 117-137 us of CPU per 64 KiB GET where
awscrt took 157 and boto3 1,285, and the most GETs per second. ``S3Client`` has the shape of
the Redis client the store source drives (``get``, ``pipeline().get()...execute()``,
``close``) plus the listing (``manifest``): an object larger than ``PART`` is fetched as
parallel ranged GETs, each with the If-Match.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import re
import threading
import urllib.parse
from dataclasses import dataclass, field

from monarch.store import keys, s3_inventory
from monarch.store.manifest import Entry, Manifest
from monarch.store.url import DEFAULT_TIMEOUT, StoreError

SCHEME = "s3"
PART = 8 << 20        # bytes per ranged GET of a large object (S3's own guidance: 8-16 MiB parts)
MAX_IN_FLIGHT = 256   # whole-object GETs at once at most: what the store source's read-ahead asks for (8 x 32)
PARTS_IN_FLIGHT = 16  # ranged GETs at once at most (128 MiB), first asked first served: see S3Client
LIST_PAGE = 1000      # keys per listing request (S3's largest page)
LIST_IN_FLIGHT = 16   # listing requests at once, for a prefix of more than a page (see S3Client._list)
LIST_DEPTH = 3        # directory levels descended to find LIST_IN_FLIGHT directories to list side by side
LIST_SPLIT = 4096     # more directories than this at one level: listed as one, page after page
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3URL:
    """Where a bucket's dataset is; ``str()`` is the URL as given (it never holds credentials)."""
    bucket: str
    prefix: str = ""  # "" or "a/b/": the keys of the dataset's files start with it
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    ca_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    inventory: str | None = None  # the S3 Inventory report's manifest.json read instead of a listing (s3_inventory.py)
    text: str = field(default="", compare=False)
    scheme = SCHEME
    has_digests = False  # no manifest digests: the client checks each GET against the listed ETag

    @classmethod
    def parse(cls, text: str) -> "S3URL":
        u = urllib.parse.urlsplit(text)
        if u.scheme != SCHEME:
            raise StoreError(f"{text!r} is not an S3 URL: expected s3://BUCKET/PREFIX")
        if "@" in u.netloc:
            raise StoreError("an S3 URL may not hold credentials (s3://KEY:SECRET@...): set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY, or name a profile of ~/.aws/credentials with ?profile=NAME")
        query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
        known = {"endpoint", "region", "profile", "ca_file", "timeout", "inventory"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise StoreError(f"{text}: unknown parameter {unknown[0]!r}; known: {', '.join(sorted(known))}")
        q = {k: v[-1] for k, v in query.items()}
        if not _BUCKET.match(u.netloc):
            raise StoreError(f"{text}: {u.netloc!r} is not a bucket name (3-63 characters: a-z, 0-9, '.', '-')")
        try:
            timeout = float(q.get("timeout", DEFAULT_TIMEOUT))
        except ValueError:
            raise StoreError(f"{text}: timeout must be a number of seconds") from None
        if timeout <= 0:
            raise StoreError(f"{text}: timeout must be more than 0 seconds")
        endpoint = q.get("endpoint") or None
        if endpoint is not None and urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
            raise StoreError(f"{text}: endpoint must be an http:// or https:// URL, got {endpoint!r}")
        prefix = u.path.strip("/")
        return cls(u.netloc, prefix + "/" if prefix else "", endpoint, q.get("region") or None,
                   q.get("profile") or None, q.get("ca_file") or None, timeout, q.get("inventory") or None, text)

    def __str__(self) -> str:
        return self.text or f"s3://{self.bucket}/{self.prefix}"

    def key(self, rel: str) -> str:
        """The object key of a file (its path relative to the dataset's top)."""
        return self.prefix + rel


# -- errors: what the S3 server answered, in a few kinds ------------------------------------------
class S3Error(Exception):
    """A request the S3 server refused: ``status`` (HTTP) and ``code`` (S3's, e.g. AccessDenied)."""

    def __init__(self, text: str, status: int = 0, code: str = ""):
        super().__init__(text)
        self.status, self.code = status, code


class S3Unreachable(S3Error):
    """No answer (connection refused, timed out) or one saying to come back (5xx, throttled)."""


class S3Changed(S3Error):
    """The object is no longer the one listed (ETag or size): never served."""


_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_CERTIFICATE = re.compile(r"InvalidCertificate\(\s*(\w+)")
_CAUSE = re.compile(r"kind: (ConnectionRefused|ConnectionReset|TimedOut|HostUnreachable|NetworkUnreachable|"
                    r"AddrNotAvailable)|(dns error[^\n,\"]*)")


def _unparsable(e: BaseException) -> bool:
    """obstore's error for a listed key that is not a path it can parse: the server did answer."""
    return "invalid path" in str(e) or "Error parsing Path" in str(e)


def _botocore_error(e: BaseException) -> S3Error:
    """A botocore exception as one of ours."""
    import botocore.exceptions
    if isinstance(e, botocore.exceptions.ClientError):
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = e.response.get("Error", {}).get("Code", "")
        if status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout"):
            return S3Unreachable(f"listing: {status} {code}", status, code)
        return S3Error(f"listing: {status} {code or 'error'}", status, code)
    if isinstance(e, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                      botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectionClosedError)):
        return S3Unreachable(f"listing: {type(e).__name__}")
    return S3Error(f"listing: {type(e).__name__}: {e}")


def _classify(e: BaseException, what: str) -> S3Error | None:
    """An obstore exception as one of ours (None: not found)."""
    if isinstance(e, FileNotFoundError):
        return None
    if _unparsable(e):  # an answer the client could not read, not a server that does not answer
        key = m.group(1) if (m := re.search(r'Error parsing Path "(.*?)"', str(e), re.S)) else "?"
        return S3Error(f"{what}: the client cannot parse the key {key!r}", 200, "UnparsableKey")
    text = str(e).split("\n", 1)[0].split(" Debug source:", 1)[0].strip()
    status = int(m.group(1)) if (m := _STATUS.search(text)) else 0
    code = m.group(1) if (m := _CODE.search(str(e))) else ""
    full = str(e)
    if m := _CERTIFICATE.search(full):  # TLS: retrying will not help
        return S3Error(f"{what}: the server's certificate is not trusted ({m.group(1)})", 0, "InvalidCertificate")
    if type(e).__name__ == "PreconditionError" or status == 412:
        return S3Changed("412 PreconditionFailed: the object changed since the job's listing (its ETag is not "
                         "the listed one)", 412, "PreconditionFailed")
    if status == 0 or status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout"):
        reason = text.rsplit(" - ", 1)[-1] if " - " in text else text
        if m := _CAUSE.search(full):
            reason += f": {m.group(1) or m.group(2)}"
        return S3Unreachable(f"{what}: {reason or type(e).__name__}", status, code)
    return S3Error(f"{what}: {status} {code or 'error'}", status, code)


# -- the ecosystem's conventions, resolved by botocore --------------------------------------------
@dataclass
class Settings:
    endpoint: str
    region: str
    ca_file: str | None
    credentials: object | None  # botocore's (refreshable) credentials; None: unsigned requests
    source: str                 # where the credentials came from ("env", "shared-credentials-file", ...)


def resolve(url: S3URL) -> Settings:
    """Endpoint, region, CA bundle and credentials as the AWS SDKs find them (StoreError, one line)."""
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        raise StoreError("a dataset in an S3 bucket needs obstore and botocore: pip install 'monarch-staging[store]'"
                         " (or: pip install obstore botocore)") from None
    try:
        session = botocore.session.Session(profile=url.profile)
        region = url.region or session.get_config_variable("region") or "us-east-1"
        endpoint = url.endpoint
        if endpoint is None:  # AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS's
            endpoint = session.create_client("s3", region_name=region).meta.endpoint_url
        credentials = session.get_credentials()
        ca_file = url.ca_file or session.get_config_variable("ca_bundle")
    except botocore.exceptions.ProfileNotFound:
        raise StoreError(f"{url}: the profile {url.profile!r} is in neither ~/.aws/credentials nor ~/.aws/config") \
            from None
    except botocore.exceptions.BotoCoreError as e:  # a malformed ~/.aws/config, a failing credential process
        raise StoreError(f"{url}: the AWS configuration could not be read: {type(e).__name__}") from None
    source = getattr(credentials, "method", "?") if credentials is not None else "none found"
    return Settings(endpoint, region, ca_file, credentials, source)


def _provider(credentials):
    """obstore's credential callback: botocore's credentials, refreshed as botocore refreshes them."""
    from botocore.credentials import RefreshableCredentials
    refreshable = isinstance(credentials, RefreshableCredentials)

    def provide() -> dict:
        frozen = credentials.get_frozen_credentials()
        expires = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
                   if refreshable else None)
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": expires}
    return provide


# -- the client ---------------------------------------------------------------------------------
class S3Client:
    """A bucket's dataset through obstore, with the interface the store source drives.

    ``manifest()`` lists the prefix and remembers each key's ETag and size; ``get(key)``
    returns the object's bytes (None: deleted) only if it is still the listed one, else
    raises S3Changed; S3Unreachable when the server does not answer (the caller's bounded
    wait retries), S3Error when it refuses."""

    def __init__(self, url: S3URL, settings: Settings):
        from obstore.store import S3Store
        self.url, self.settings = url, settings
        self.listed: dict[str, tuple[int, str]] = {}  # key -> (size, ETag) of the listing
        self.skipped: list[tuple[str, str]] = []  # the keys of ping's page not served as files
        client = {"connect_timeout": f"{url.timeout}s", "read_timeout": f"{url.timeout}s",
                  "allow_http": settings.endpoint.startswith("http://"), "pool_idle_timeout": "60s"}
        if settings.ca_file and settings.endpoint.startswith("https://"):
            try:
                with open(settings.ca_file, "rb") as f:
                    client["root_certificate"] = f.read()
            except OSError as e:
                raise StoreError(f"{url}: the CA bundle {settings.ca_file} cannot be read: {e.strerror}") from None
        retry = {"max_retries": 3, "retry_timeout": datetime.timedelta(seconds=url.timeout),
                 "backoff": {"init_backoff": datetime.timedelta(milliseconds=50),
                             "max_backoff": datetime.timedelta(seconds=1), "base": 2.0}}
        kwargs = {"endpoint": settings.endpoint, "region": settings.region, "client_options": client,
                  "retry_config": retry, "virtual_hosted_style_request": False}
        if settings.credentials is None:
            kwargs["skip_signature"] = True
        else:
            kwargs["credential_provider"] = _provider(settings.credentials)
        self.store, self._kwargs = S3Store(url.bucket, **kwargs), kwargs
        self._pools: dict[bool, concurrent.futures.ThreadPoolExecutor] = {}  # ranged? -> its threads
        self._lock = threading.Lock()

    # -- the listing --------------------------------------------------------------------------
    def ping(self) -> None:
        """One listing request: the endpoint answers, the bucket exists, the credentials may list
        it, and it holds objects under the prefix (a whole check: ``monarch run`` needs no more).
        ``skipped``: the keys of that first page not served as files (``keys.screen``), to be
        named at start; the listing's whole count comes with the snapshot."""
        import obstore
        try:
            page = next(iter(obstore.list(self.store, self.url.prefix or None, chunk_size=LIST_PAGE)), [])
        except Exception as e:
            if not _unparsable(e):
                raise _classify(e, "listing") or S3Error("listing: not found", 404) from None
            page = self._list_botocore(pages=1)  # a key obstore cannot parse: botocore takes any
        if not page:
            raise S3Error("no objects under the prefix", 200, "Empty")
        self.skipped = self._screen(page, set())[2]
        if self.url.inventory:  # a report of no use is said at the start, not when the snapshot is taken
            s3_inventory.check(self.url.inventory, self.url.bucket, self._fetch)

    def manifest(self) -> Manifest:
        """The prefix's listing as a manifest (each file's digest: its ETag); a key ending in '/'
        is a directory; a key that cannot be a file (``keys.screen``) is skipped and named in
        ``Manifest.skipped``."""
        try:
            metas, prefixes = (s3_inventory.read(self.url.inventory, self.url.bucket, self.url.prefix, self._fetch),
                               set()) if self.url.inventory else self._list()
        except StoreError:
            raise
        except Exception as e:
            raise _classify(e, "listing") or S3Error("listing: not found", 404) from None
        objects, dirs, skipped = self._screen(metas, prefixes)
        top = self.url.prefix
        files: dict[str, Entry] = {}
        listed: dict[str, tuple[int, str]] = {}
        newest = 0
        for rel, meta in objects.items():
            mtime = int(meta["last_modified"].timestamp() * 1e9)
            newest = max(newest, mtime)
            etag = meta.get("e_tag") or ""
            files[rel] = Entry(rel, int(meta["size"]), mtime, etag)
            listed[top + rel] = (int(meta["size"]), etag)
        dirs |= {rel[:i] for rel in files for i, c in enumerate(rel) if c == "/"}
        entries = tuple(sorted(files.values(), key=lambda e: e.path))
        version = hashlib.blake2b(repr([(e.path, e.size, e.digest) for e in entries]).encode(),
                                  digest_size=16).hexdigest()
        with self._lock:
            self.listed = listed
        return Manifest(entries, tuple(sorted(dirs)), newest / 1e9, version, tuple(skipped))

    def _screen(self, metas: list[dict], prefixes: set[str]) -> tuple[dict[str, dict], set[str], list]:
        """The listed objects served as files (rel -> metadata), the directories, and the
        skipped keys as (key, why); a key ending in '/' of no bytes is a console's "folder"."""
        top = self.url.prefix
        dirs = {key[len(top):].rstrip("/") for key in prefixes if key.startswith(top)}
        objects: dict[str, dict] = {}
        for meta in metas:
            key = meta["path"]
            if not key.startswith(top) or key == top:
                continue
            rel = key[len(top):]
            if rel.endswith("/") and meta["size"] == 0 and keys.why_not_a_path(rel[:-1]) is None:
                dirs.add(rel[:-1])
                continue
            objects[rel] = meta
        # obstore's flat listing drops a console folder's '/': a zero-byte object named like a
        # prefix is that folder (no bytes to lose), not an object the prefix hides
        parents = {rel[:i] for rel in objects for i, c in enumerate(rel) if c == "/"}
        for rel in [r for r in objects if r in parents and objects[r]["size"] == 0]:
            dirs.add(rel)
            del objects[rel]
        dirs = {d for d in dirs if d and keys.why_not_a_path(d) is None}
        kept, skipped = keys.screen(list(objects), dirs)
        return {rel: objects[rel] for rel in kept}, dirs, skipped

    def _list(self) -> tuple[list[dict], set[str]]:
        """Every object under the prefix, and the directory prefixes seen: through obstore, or,
        when one key is not a path obstore can parse (a newline, ``a//b``, ``..``), through
        botocore, which takes any key; obstore fails the whole listing on such a key."""
        try:
            return self._list_obstore()
        except Exception as e:
            if not _unparsable(e):
                raise
        return self._list_botocore(), set()

    def _fetch(self, bucket: str, key: str) -> bytes:
        """One object whole, of this bucket or another the same credentials read (an inventory's)."""
        import obstore
        from obstore.store import S3Store
        try:
            return bytes(obstore.get(self.store if bucket == self.url.bucket else S3Store(bucket, **self._kwargs),
                                     key).bytes())
        except Exception as e:
            raise _classify(e, f"s3://{bucket}/{key}") or StoreError(f"s3://{bucket}/{key} is not there") from None

    def _list_botocore(self, pages: int = 0) -> list[dict]:
        """The prefix's every object (its first ``pages`` pages: 0, all) as obstore's metadata,
        listed by botocore page after page."""
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config
        settings = self.settings
        config = Config(connect_timeout=self.url.timeout, read_timeout=self.url.timeout, s3={"addressing_style": "path"},
                        retries={"max_attempts": 3}, **({"signature_version": UNSIGNED}
                                                         if settings.credentials is None else {}))
        session = botocore.session.Session(profile=self.url.profile)
        frozen = settings.credentials.get_frozen_credentials() if settings.credentials is not None else None
        client = session.create_client(
            "s3", region_name=settings.region, endpoint_url=settings.endpoint, config=config,
            verify=settings.ca_file if settings.ca_file else None,
            aws_access_key_id=frozen.access_key if frozen else None,
            aws_secret_access_key=frozen.secret_key if frozen else None,
            aws_session_token=frozen.token if frozen else None)
        metas = []
        try:
            for n, page in enumerate(client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.url.bucket, Prefix=self.url.prefix, PaginationConfig={"PageSize": LIST_PAGE})):
                if pages and n >= pages:
                    break
                metas += [{"path": o["Key"], "size": o["Size"], "last_modified": o["LastModified"],
                           "e_tag": o.get("ETag")} for o in page.get("Contents", ())]
        except Exception as e:
            raise _botocore_error(e) from None
        finally:
            client.close()
        return metas

    def _list_obstore(self) -> tuple[list[dict], set[str]]:
        """Every object under the prefix (obstore's metadata), and the directory prefixes seen.

        One listing request answers a prefix of fewer than LIST_PAGE objects. A larger one is
        listed by directories, in parallel: levels of ``list_with_delimiter`` while they hold
        fewer than LIST_IN_FLIGHT directories (at most LIST_DEPTH levels), then each directory
        of the last level listed whole, LIST_IN_FLIGHT at once, so that ImageNet's 1.28M keys
        in 1,000 class directories take ~2,000 requests 16 at once rather than 1,282 one after
        the other. More than LIST_SPLIT directories at a level: listed page after page."""
        import obstore
        top = self.url.prefix.rstrip("/") or None
        pages = iter(obstore.list(self.store, top, chunk_size=LIST_PAGE))
        first = next(pages, [])
        if len(first) < LIST_PAGE:
            return list(first), set()
        metas: dict[str, dict] = {m["path"]: m for m in first}
        prefixes: set[str] = set()
        level: list[str | None] = [top]
        with concurrent.futures.ThreadPoolExecutor(LIST_IN_FLIGHT, thread_name_prefix="monarch-s3-list") as pool:
            for _ in range(LIST_DEPTH):
                if not level or len(level) >= LIST_IN_FLIGHT:
                    break
                below: list[str] = []
                for got in pool.map(lambda p: obstore.list_with_delimiter(self.store, p), level):
                    metas.update((m["path"], m) for m in got["objects"])
                    below += got["common_prefixes"]
                prefixes.update(below)
                level = below
            if len(level) > LIST_SPLIT:
                level = [top]  # many small directories: one listing, page after page, is fewer requests
            for got in pool.map(lambda p: [m for page in obstore.list(self.store, p, chunk_size=LIST_PAGE)
                                           for m in page], level):
                metas.update((m["path"], m) for m in got)
        return list(metas.values()), prefixes

    # -- the objects ----------------------------------------------------------------------------
    def get(self, key: str):
        """The object's bytes, if it is still the listed one (None: deleted or never listed); a
        large one's as ``Pieces``."""
        parts = self._parts(key)
        if parts is None:
            return None
        if len(parts) == 1:
            return self._get_part(key, *parts[0])
        futures = [self._submit(key, p) for p in parts]  # a large object: its parts at once
        return self._assemble(key, [f.result() for f in futures])

    def pipeline(self, transaction: bool = False) -> "_Pipeline":
        return _Pipeline(self)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    # -- internals --------------------------------------------------------------------------------
    def _parts(self, key: str) -> list[tuple[str, int, tuple[int, int] | None]] | None:
        """(ETag, size, byte range or None: whole) of each GET of ``key``; None: not listed."""
        got = self.listed.get(key)
        if got is None:
            return None
        size, etag = got
        if size <= PART:
            return [(etag, size, None)]
        return [(etag, size, (start, min(start + PART, size))) for start in range(0, size, PART)]

    def _get_part(self, key: str, etag: str, size: int, byte_range: tuple[int, int] | None):
        import obstore
        options: dict = {"if_match": etag} if etag else {}
        if byte_range is not None:
            options["range"] = byte_range
        try:
            result = obstore.get(self.store, key, options=options)
            data = result.bytes()
        except Exception as e:
            err = _classify(e, key)
            if err is None:
                return None
            raise err from None
        if int(result.meta["size"]) != size:
            raise S3Changed(f"a size of {result.meta['size']} bytes, {size} listed: the object changed since the "
                            "job's listing", 200, "SizeChanged")
        return data

    @staticmethod
    def _assemble(key: str, parts: list):
        if any(p is None for p in parts):
            return None
        return parts[0] if len(parts) == 1 else Pieces(parts)

    def _submit(self, key: str, part: tuple) -> concurrent.futures.Future:
        """One GET on its pool: a whole object on the wide one, a ranged part of a large one on the
        narrow one, in the order asked, so that large objects arrive one after the other at the
        link's rate, not all together at the end (measured, 16 x 64 MiB at 50 ms: with every part
        at once, the first object came after ~3 s and the daemon's threads starved)."""
        ranged = part[2] is not None
        with self._lock:
            pool = self._pools.get(ranged)
            if pool is None:
                pool = self._pools[ranged] = concurrent.futures.ThreadPoolExecutor(
                    PARTS_IN_FLIGHT if ranged else MAX_IN_FLIGHT, thread_name_prefix="monarch-s3")
            return pool.submit(self._get_part, key, *part)


class Pieces:
    """A large object's bytes as its ranged GETs brought them, in order, never joined (joining
    1 GiB cost 0.7 s of CPU, half of what fetching it costs); ``len()`` is the object's size."""

    __slots__ = ("buffers", "size")

    def __init__(self, buffers: list):
        self.buffers, self.size = buffers, sum(len(b) for b in buffers)

    def __len__(self) -> int:
        return self.size


class _Pipeline:
    """GETs gathered, then sent at once (``execute``): each object's value, None (deleted) or
    the S3Error that refused it (changed) in the order asked, as soon as all have answered;
    S3Unreachable raised if the server did not answer one of them."""

    def __init__(self, client: S3Client):
        self.client, self.keys = client, []

    def get(self, key: str) -> "_Pipeline":
        self.keys.append(key)
        return self

    def execute(self) -> list:
        client = self.client
        asked = [(key, client._parts(key)) for key in self.keys]
        futures = [(key, None if parts is None else [client._submit(key, p) for p in parts])
                   for key, parts in asked]
        values: list = []
        unreachable: S3Unreachable | None = None
        for key, parts in futures:
            if parts is None:
                values.append(None)
                continue
            try:
                values.append(client._assemble(key, [f.result() for f in parts]))
            except S3Unreachable as e:
                unreachable = unreachable or e
                values.append(None)
            except S3Error as e:
                values.append(e)
        if unreachable is not None:
            raise unreachable
        return values


# -- one line per failure ---------------------------------------------------------------------
def connect(url: S3URL) -> S3Client:
    try:
        import obstore  # noqa: F401
    except ImportError:
        raise StoreError("a dataset in an S3 bucket needs obstore and botocore: pip install 'monarch-staging[store]'"
                         " (or: pip install obstore botocore)") from None
    return S3Client(url, resolve(url))


def ping(url: S3URL) -> S3Client:
    """A client whose bucket answered one listing request (StoreError, one line, otherwise); its
    ``skipped``: the keys of that request not served as files."""
    client = connect(url)
    try:
        client.ping()
    except Exception as e:
        client.close()
        raise StoreError(explain(url, e, client.settings)) from None
    return client


def explain(url: S3URL, e: BaseException, settings: Settings | None = None) -> str:
    """One line saying what went wrong with the bucket at ``url``, and what to do. It names where
    the credentials came from, never what they are."""
    where = f" at {settings.endpoint}" if settings is not None else ""
    creds = f" (credentials: {settings.source})" if settings is not None else ""
    if isinstance(e, StoreError):
        return str(e)
    if isinstance(e, S3Unreachable):
        return (f"the store at {url} is unreachable{where} ({e}); check the endpoint (?endpoint=, AWS_ENDPOINT_URL) "
                "and that the server runs")
    if isinstance(e, S3Error):
        if e.code == "Empty":
            return f"the store at {url} holds no objects under the prefix {url.prefix!r}; check the URL's path"
        if e.code == "InvalidCertificate":
            return (f"the store at {url}: {e}; name the certificate authority that signed it with ?ca_file=PEM "
                    "or AWS_CA_BUNDLE")
        if e.code == "NoSuchBucket" or (e.status == 404 and not e.code):
            return f"the store at {url}: the bucket {url.bucket!r} does not exist{where}"
        if e.code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidToken", "ExpiredToken",
                      "InvalidClientTokenId", "AuthorizationHeaderMalformed"):
            return (f"the store at {url} refused the credentials ({e.code}){creds}: check AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY or the profile (?profile=, AWS_PROFILE) in ~/.aws/credentials")
        if e.status == 403:
            return (f"the store at {url} denied access ({e.code or 403}){creds}: these credentials may not list or "
                    f"read s3://{url.bucket}/{url.prefix}")
        return f"the store at {url} failed: {e}"
    return f"the store at {url} failed: {type(e).__name__}"


def is_connection_error(e: BaseException) -> bool:
    return isinstance(e, S3Unreachable)


def fetch_manifest(client: S3Client, url: S3URL) -> Manifest:
    """The bucket's listing as the job's manifest (StoreError, one line: refused, or nothing under the prefix)."""
    try:
        manifest = client.manifest()
    except Exception as e:
        raise StoreError(explain(url, e, client.settings)) from None
    if not manifest.files:
        raise StoreError(f"the store at {url} holds no objects under the prefix {url.prefix!r}; check the URL's path")
    return manifest

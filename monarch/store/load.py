"""``monarch store put DIR URL`` and ``monarch store ls URL``: a dataset loaded into a store,
and what a store holds.

A put reads the directory's files on ``jobs`` threads, each file's bytes and its progress
entry written in one transaction (``MULTI``: a value is never recorded as loaded before it
is), so a put that was interrupted resumes with the files it had not loaded (or that
changed since: size or mtime). The manifest is deleted first and written last: while a put
runs, no job serves the half-loaded dataset.
"""

from __future__ import annotations

import concurrent.futures
import os
import stat
import sys
import threading
import time
from typing import TextIO

from monarch.sizes import human
from monarch.store import s3
from monarch.store.client import explain, ping
from monarch.store.manifest import MANIFEST, META, PROGRESS, Entry, Manifest, digest
from monarch.store.url import StoreError, StoreURL

MAX_VALUE = 512 << 20  # Redis's largest string value


def fetch_manifest(client, url: StoreURL) -> Manifest:
    """The store's manifest (StoreError, one line, when there is none or it is not one); an S3
    bucket's is its listing."""
    if url.scheme == s3.SCHEME:
        return s3.fetch_manifest(client, url)
    try:
        data = client.get(url.key(MANIFEST))
    except Exception as e:
        raise StoreError(explain(url, e)) from None
    if data is None:
        try:
            loading = client.hlen(url.key(PROGRESS))
        except Exception:
            loading = 0
        if loading:
            raise StoreError(f"the store at {url} has no manifest yet: a put loaded {loading} files and did not "
                             "finish; run `monarch store put DIR URL` again to finish it")
        raise StoreError(f"the store at {url} holds no Monarch dataset (no {MANIFEST} under prefix "
                         f"{url.prefix!r}); load one with `monarch store put DIR URL`")
    try:
        return Manifest.decode(data)
    except ValueError as e:
        raise StoreError(f"the store at {url}: {e}") from None


def _scan(top: str) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """The regular files (symlinks to files followed, as a reader would) and directories below ``top``."""
    files, dirs = [], []
    for here, subdirs, names in os.walk(top):
        rel_here = os.path.relpath(here, top)
        rel_here = "" if rel_here == "." else rel_here.replace(os.sep, "/")
        subdirs.sort()
        for d in subdirs:
            dirs.append(f"{rel_here}/{d}" if rel_here else d)
        for name in sorted(names):
            rel = f"{rel_here}/{name}" if rel_here else name
            try:
                st = os.stat(os.path.join(here, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((rel, st))
    return files, dirs


class _Progress:
    def __init__(self, total_files: int, total_bytes: int, out: TextIO | None):
        self.total_files, self.total_bytes, self.out = total_files, total_bytes, out
        self.files = self.bytes = 0
        self.t0 = self.shown = time.monotonic()
        self.tty = out is not None and out.isatty()
        self.lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.files += 1
            self.bytes += nbytes
            now = time.monotonic()
            if self.out is not None and (now - self.shown >= (0.2 if self.tty else 5.0)):
                self.shown = now
                self._show(now)

    def _show(self, now: float, end: str = "") -> None:
        rate = self.bytes / max(now - self.t0, 1e-6)
        bar = ""
        if self.total_bytes:
            done = int(30 * self.bytes / self.total_bytes)
            bar = "[" + "#" * done + "." * (30 - done) + "] "
        line = (f"put: {bar}{self.files}/{self.total_files} files, {human(self.bytes)} of "
                f"{human(self.total_bytes)}, {human(rate)}/s")
        self.out.write(("\r" + line + "\033[K" if self.tty else line + "\n") + end)
        self.out.flush()

    def close(self) -> None:
        if self.out is not None and self.files:
            self._show(time.monotonic(), "\n" if self.tty else "")


def put(directory: str, url: StoreURL, jobs: int = 16, out: TextIO | None = sys.stderr,
        env=None) -> tuple[Manifest, int]:
    """Load ``directory`` into the store at ``url``; returns the manifest written and how many
    files this call loaded (the rest were loaded by an earlier, interrupted put)."""
    if url.scheme == s3.SCHEME:
        raise StoreError(f"store put: {url} is an S3 bucket, read as it is (its listing is the manifest): load it "
                         f"with your S3 tools, e.g. aws s3 sync {directory} s3://{url.bucket}/{url.prefix}")
    top = os.path.realpath(directory)
    if not os.path.isdir(top):
        raise StoreError(f"store put: {directory} is not a directory")
    files, dirs = _scan(top)
    if any(rel == META or rel.startswith(META + "/") for rel, _ in files) or META in dirs:
        raise StoreError(f"store put: {directory} has a top-level {META}, which is where the store keeps its "
                         "manifest; rename it")
    big = [rel for rel, st in files if st.st_size > MAX_VALUE]
    if big:
        raise StoreError(f"store put: {os.path.join(directory, big[0])} is larger than a store value may be "
                         f"({human(MAX_VALUE)})")
    client = ping(url, env)
    progress_key = url.key(PROGRESS)
    try:
        client.delete(url.key(MANIFEST))  # no job serves the dataset while it changes
        done_before = {os.fsdecode(k): v.decode() for k, v in client.hgetall(progress_key).items()}
    except Exception as e:
        raise StoreError(explain(url, e)) from None
    entries: dict[str, Entry] = {}
    todo = []
    for rel, st in files:
        was = done_before.get(rel, "").split(" ")
        if len(was) == 3 and was[0] == str(st.st_size) and was[1] == str(st.st_mtime_ns):
            entries[rel] = Entry(rel, st.st_size, st.st_mtime_ns, was[2])
        else:
            todo.append((rel, st))
    shown = _Progress(len(todo), sum(st.st_size for _, st in todo), out)

    def load(rel: str) -> Entry:
        path = os.path.join(top, rel)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
        if len(data) != st.st_size:
            raise StoreError(f"store put: {path} changed while it was read; run the put again")
        entry = Entry(rel, st.st_size, st.st_mtime_ns, digest(data))
        pipe = client.pipeline(transaction=True)
        pipe.set(url.key(rel), data)
        pipe.hset(progress_key, os.fsencode(rel), f"{entry.size} {entry.mtime_ns} {entry.digest}")
        pipe.execute()
        shown.add(len(data))
        return entry

    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs), thread_name_prefix="monarch-put") as pool:
            for entry in pool.map(load, [rel for rel, _ in todo]):
                entries[entry.path] = entry
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(f"store put: {e.filename or directory}: {e.strerror}") from None
    except Exception as e:
        raise StoreError(explain(url, e) + f"; {shown.files} files were loaded: run the put again to resume") \
            from None
    finally:
        shown.close()
    encoded = Manifest(tuple(entries[rel] for rel, _ in files), tuple(dirs), time.time()).encode()
    manifest = Manifest.decode(encoded)  # as a job will read it, its version included
    try:
        pipe = client.pipeline(transaction=True)
        pipe.set(url.key(MANIFEST), encoded)
        pipe.delete(progress_key)
        pipe.execute()
    except Exception as e:
        raise StoreError(explain(url, e) + "; run the put again to write the manifest") from None
    finally:
        client.close()
    return manifest, len(todo)


def ls(url: StoreURL, long: bool = False, out: TextIO = sys.stdout, env=None) -> Manifest:
    """Print what the store holds: one path per file (``long``: size and digest too), then a summary."""
    client = ping(url, env)
    try:
        manifest = fetch_manifest(client, url)
    finally:
        client.close()
    for e in manifest.files:
        out.write(f"{e.size:>12}  {e.digest}  {e.path}\n" if long else f"{e.path}\n")
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest.created)) if manifest.created else "?"
    out.write(f"{len(manifest.files)} files, {human(manifest.total_bytes)} ({manifest.total_bytes} bytes) in "
              f"{url}; " + (f"listing {manifest.version[:12]}, newest object {created}\n" if url.scheme == s3.SCHEME
                            else f"manifest {manifest.version[:12]}, written {created}\n"))
    return manifest

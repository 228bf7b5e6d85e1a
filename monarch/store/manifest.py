"""The manifest a store holds beside a dataset's values: every file's path, size, mtime and
digest, and every directory. The snapshot is built from it alone, without listing the store.

Keys under a dataset's ``prefix``: each file's bytes at ``prefix + <path under the top>``;
the manifest at ``prefix + ".monarch/manifest"`` (zlib-compressed JSON), written last by
``monarch store put`` so that a half-loaded dataset is never served; the put's progress
(``prefix + ".monarch/put"``, a hash: path -> size, mtime, digest) while it runs, so that
an interrupted put resumes where it stopped.

The manifest's own digest is the dataset's version: a manifest that changed is another
dataset (``Manifest.version``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass

from monarch import protocol
from monarch.records.filetable import DirInfo, FileInfo, FileTable, Listing
from monarch.store import keys

FORMAT = "monarch.store-manifest/1"
DIGEST = "blake2b-128"
META = ".monarch"  # the dataset's own keys live under prefix + META + "/"
MANIFEST = META + "/manifest"
PROGRESS = META + "/put"
DEVICE = 0x4D4B5600  # st_dev of a store's files (+ the root's index): not any disk's


def digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the dataset's top, '/'-separated
    size: int
    mtime_ns: int
    digest: str


@dataclass(frozen=True)
class Manifest:
    files: tuple[Entry, ...]
    dirs: tuple[str, ...] = ()  # every directory below the top (empty ones too)
    created: float = 0.0
    version: str = ""  # the digest of the encoded manifest (set by decode)
    skipped: tuple[tuple[str, str], ...] = ()  # (key, why) of the keys not served as files (keys.screen)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)

    def encode(self) -> bytes:
        doc = {"format": FORMAT, "digest": DIGEST, "created": self.created or time.time(),
               "files": [[e.path, e.size, e.mtime_ns, e.digest] for e in self.files], "dirs": list(self.dirs)}
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)

    @classmethod
    def decode(cls, data: bytes) -> "Manifest":
        try:
            doc = json.loads(zlib.decompress(data))
            if doc.get("format") != FORMAT or doc.get("digest") != DIGEST:
                raise ValueError(f"format {doc.get('format')!r}, digest {doc.get('digest')!r}")
            files = tuple(Entry(str(p), int(s), int(m), str(d)) for p, s, m, d in doc["files"])
            dirs = tuple(str(d) for d in doc.get("dirs", ()))
        except (ValueError, KeyError, TypeError, zlib.error) as e:
            raise ValueError(f"not a Monarch manifest ({FORMAT}): {e}") from None
        for e in files:
            if e.size < 0:
                raise ValueError(f"not a Monarch manifest: bad entry {e.path!r} (size {e.size})")
        # written by hand or by another tool: a path that cannot be a file is skipped and named, not fatal
        kept, skipped = keys.screen([e.path for e in files], [d for d in dirs if keys.why_not_a_path(d) is None])
        files = tuple(e for e in files if e.path in kept)
        dirs = tuple(d for d in dirs if keys.why_not_a_path(d) is None)
        return cls(files, dirs, float(doc.get("created", 0)), hashlib.blake2b(data, digest_size=16).hexdigest(),
                   tuple(skipped))


def _plain(rel: str) -> bool:
    return keys.why_not_a_path(rel) is None


def _ino(k: int, rel: str) -> int:
    """A stable inode number for a path of a store's root (never 0)."""
    h = int.from_bytes(hashlib.blake2b(f"{k}/{rel}".encode(), digest_size=8).digest(), "little")
    return (h >> 2) | 1


def add_to_snapshot(k: int, manifest: Manifest, mount: str, files: FileTable | dict, dirs: dict) -> list[str]:
    """Describe root ``k`` (mounted at ``mount``) from ``manifest`` into a snapshot's ``files``
    and ``dirs``, as a walk of a directory holding those files would (a listing per
    directory, sorted; the files this user's, read-only for others). Returns its file keys."""
    uid, gid = os.getuid(), os.getgid()
    dev = DEVICE + k
    children: dict[str, list[tuple[bytes, int, int]]] = {"": []}
    newest: dict[str, int] = {"": int(manifest.created * 1e9)}

    def ensure_dir(rel: str) -> None:
        """Make ``rel`` a known directory, listed in its parent (and those above it)."""
        if rel in children:
            return
        parent, _, name = rel.rpartition("/")
        ensure_dir(parent)
        children[rel] = []
        children[parent].append((os.fsencode(name), protocol.DT_DIR, _ino(k, rel)))

    for d in manifest.dirs:
        if _plain(d):
            ensure_dir(d)
    names = []
    for e in sorted(manifest.files, key=lambda e: e.path):
        if not _plain(e.path) or f"{k}/{e.path}" in files:  # never a path outside the root, never one twice
            continue
        parent, _, name = e.path.rpartition("/")
        ensure_dir(parent)
        ino = _ino(k, e.path)
        children[parent].append((os.fsencode(name), protocol.DT_REG, ino))
        key = f"{k}/{e.path}"
        files[key] = FileInfo(e.size, e.mtime_ns, 0o100644, e.mtime_ns, e.mtime_ns, ino, dev, uid, gid, 1, False,
                              (e.size + 511) // 512, 4096)
        names.append(key)
        newest[parent] = max(newest.get(parent, 0), e.mtime_ns)
    try:
        top_parent = os.stat(os.path.dirname(mount.rstrip("/")) or "/").st_ino
    except OSError:
        top_parent = 0
    for rel, listing in children.items():
        mtime = newest.get(rel, newest[""])
        info = FileInfo(4096, mtime, 0o040755, mtime, mtime, _ino(k, rel) if rel else _ino(k, "/"), dev, uid, gid,
                        2 + sum(1 for _, t, _ in listing if t == protocol.DT_DIR), False, 8, 4096)
        parent_ino = top_parent if not rel else (_ino(k, rel.rpartition("/")[0]) if "/" in rel else _ino(k, "/"))
        dirs[f"{k}/{rel}"] = DirInfo(info, Listing(sorted(listing)), parent_ino)
    return names

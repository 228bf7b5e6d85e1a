"""The index built in the file the shim will map: a manifest or a kept snapshot copied there by
the kernel, the C walk's index built into it, published by a rename, nothing left behind."""

from __future__ import annotations

import mmap
import os
import pickle
import time

import pytest

from monarch import protocol
from monarch.node.snapshot import index_file as index_file_module
from monarch.node.snapshot import walker
from monarch.node.snapshot.index_file import IndexFile
from monarch.node.snapshot.indextable import used_end
from monarch.node.snapshot.snapshot import load_or_walk, write_manifest

needs_c_walk = pytest.mark.skipif(walker.library() is None, reason="the C walker could not be built here")


def tree(root, n=50):
    for d in range(3):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(n):
            (root / f"d{d}" / f"f{i}.bin").write_bytes(os.urandom(i + 1))
    return (str(root),)


def leftovers(at: str) -> list[str]:
    directory, name = os.path.split(at)
    return sorted(n for n in os.listdir(directory) if n.startswith(name))


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "sendfile"])
def test_a_copy_is_the_source_byte_for_byte_and_is_published_by_a_rename(tmp_path, monkeypatch, kernel_copy):
    source = tmp_path / "source"
    source.write_bytes(os.urandom(3 * 65536 + 17))
    if not kernel_copy:  # across filesystems where copy_file_range refuses: sendfile
        def refuse(*_):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(index_file_module.os, "copy_file_range", refuse)
    at = str(tmp_path / "index-1")
    made = IndexFile.copy_of(str(source), at)
    assert bytes(made.data) == source.read_bytes() and os.path.exists(made.path)
    ino = os.stat(made.path).st_ino
    made.data[:4] = b"\0\0\0\0"  # written where the published file is read: one set of pages
    made.publish(at)
    assert os.stat(at).st_ino == ino and open(at, "rb").read(4) == b"\0\0\0\0"
    assert leftovers(at) == ["index-1"]


def test_a_discarded_file_leaves_nothing(tmp_path):
    at = str(tmp_path / "index-2")
    made = IndexFile.blank(at, 4096)
    assert leftovers(at) == [os.path.basename(made.path)]
    made.discard()
    made.discard()  # twice: nothing to do
    assert leftovers(at) == []


@needs_c_walk
def test_a_manifest_is_served_from_its_copy_beside_the_index_and_the_shared_pages_take_descriptions(tmp_path):
    roots = tree(tmp_path / "ds")
    manifest = str(tmp_path / "ds.index")
    write_manifest(roots, manifest)
    at = str(tmp_path / "run" / "index-3")
    os.makedirs(os.path.dirname(at))
    snap, how = load_or_walk(roots, None, manifest=manifest, describe=False, check_later=True, index_at=at)
    assert isinstance(snap.files.data, mmap.mmap) and snap.index_file.path.startswith(at + ".tmp-")
    snap.publish_index(at, snap.index_parts())
    assert leftovers(at) == ["index-3"]
    info = snap.files.get("0/d1/f9.bin")  # described now: in the published file the shim maps
    assert info is not None and info.size == 10
    published = open(at, "rb").read()
    assert published == bytes(snap.files.data) and published != open(manifest, "rb").read()


@needs_c_walk
def test_a_walk_builds_its_index_in_the_file_and_a_changed_manifest_leaves_no_copy(tmp_path):
    roots = tree(tmp_path / "ds")
    manifest = str(tmp_path / "ds.index")
    write_manifest(roots, manifest, describe=True)  # checked before the job: a directory changed
    time.sleep(0.01)
    (tmp_path / "ds" / "d0" / "new.bin").write_bytes(b"n")
    at = str(tmp_path / "index-4")
    snap, how = load_or_walk(roots, None, manifest=manifest, describe=False, index_at=at)
    assert how.startswith("walked: a directory changed since the manifest")
    assert leftovers(at) == [os.path.basename(snap.index_file.path)]  # the walk's own, and only it
    header = protocol.INDEX_HEADER.unpack_from(snap.files.data)
    assert header[0] == protocol.INDEX_MAGIC and "0/d0/new.bin" in snap.files
    snap.publish_index(at, snap.index_parts())
    assert leftovers(at) == ["index-4"]


@needs_c_walk
def test_a_listing_walks_index_holds_no_stat_until_a_file_is_described(tmp_path):
    """A listed file costs its 8-byte record, its name and its inode (no bucket): no 112-byte
    stat until it is described, and then only the one (the node's memory at 10 million files is
    this, times 10 million). The file's room for stats is sparse: no block of it is written before
    a file needs it."""
    n = 300
    roots = tree(tmp_path / "ds", n=n)
    at = str(tmp_path / "index-m")
    snap, _ = load_or_walk(roots, None, describe=False, index_at=at)
    snap.publish_index(at, snap.index_parts())
    files = 3 * n
    held = os.stat(at).st_blocks * 512
    assert os.path.getsize(at) >= protocol.INDEX_ENTRY.size * files  # the room is there
    assert held <= 26 * files, held / files  # record 8, name 6, inode 8, pages' ends (a bucket a file: 27)
    assert snap.files.get("0/d1/f9.bin").size == 10
    assert os.stat(at).st_blocks * 512 <= held + 4096  # one stat written: one page of the room at most


def test_a_damaged_manifest_copy_is_removed_and_the_dataset_walked(tmp_path):
    roots = tree(tmp_path / "ds", n=3)
    manifest = tmp_path / "ds.index"
    manifest.write_bytes(b"garbage" * 100)
    at = str(tmp_path / "index-5")
    snap, how = load_or_walk(roots, None, manifest=str(manifest), index_at=at)
    assert how.startswith(f"walked: the manifest {manifest} is not one")
    own = [os.path.basename(snap.index_file.path)] if snap.index_file else []  # the C walk's own file, unpublished
    assert leftovers(at) == own and "0/d2/f2.bin" in snap.files


_HEADER_FIELDS = ("magic", "version", "entries", "buckets", "reserved", "buckets_off", "entries_off", "keys_off",
                  "keys_size", "children_off", "children_count", "files", "stats_used", "files_off", "stats_off", "size",
                  "dirs", "reserved2", "names_size", "ranges_off", "sizes_off", "inos_off")


@pytest.mark.parametrize("damage, said", [
    ({"cut": protocol.INDEX_HEADER.size}, "its buckets ("),
    ({"cut": "half"}, "lie past its end"),
    ({"buckets": 0}, "its buckets (0) hold no key"),
    ({"dirs": 1 << 20}, "are not fewer than its buckets"),
    ({"keys_off": 1 << 40}, "its key bytes ("),
    ({"children_count": 1 << 30}, "its child records ("),
    ({"stats_used": 1 << 20}, "stats used (1048576)"),
    ({"size": 1 << 40}, "its size (1099511627776) is not where"),
], ids=["header only", "half", "buckets", "entries", "keys", "children", "stats used", "size"])
@pytest.mark.parametrize("index_at", [True, False], ids=["copied", "read"])
def test_a_manifest_whose_tables_the_shim_would_refuse_is_walked_instead_and_the_damage_said(tmp_path, damage, said,
                                                                                           index_at):
    """A manifest (or a kept snapshot) the shim and the front door would refuse to map (a table
    out of bounds, no bucket) is never the job's snapshot: taken, it left
    the job with nothing staged and every metadata call the PFS's, or no snapshot at all."""
    roots = tree(tmp_path / "ds", n=4)
    manifest = tmp_path / "ds.index"
    write_manifest(roots, str(manifest))
    data = bytearray(manifest.read_bytes())
    if "cut" in damage:
        del data[used_end(data) // 2 if damage["cut"] == "half" else damage["cut"]:]  # half its tables
    else:
        fields = dict(zip(_HEADER_FIELDS, protocol.INDEX_HEADER.unpack_from(data)), **damage)
        protocol.INDEX_HEADER.pack_into(data, 0, *fields.values())
    manifest.write_bytes(bytes(data))
    at = str(tmp_path / "index-d") if index_at else None
    snap, how = load_or_walk(roots, None, manifest=str(manifest), index_at=at)
    assert how.startswith(f"walked: the manifest {manifest} is not one `monarch index` wrote (ValueError: "), how
    assert said in how and how.endswith("): run `monarch index` again"), how
    assert "0/d2/f3.bin" in snap.files
    if at:
        assert leftovers(at) == ([os.path.basename(snap.index_file.path)] if snap.index_file else [])


@needs_c_walk
def test_a_snapshot_sent_to_another_node_carries_its_index_not_this_nodes_file(tmp_path):
    """Node 0 broadcasts its walk: the receiver gets the index's bytes and publishes its own file."""
    roots = tree(tmp_path / "ds", n=5)
    at = str(tmp_path / "index-6")
    snap, _ = load_or_walk(roots, None, index_at=at)
    received = pickle.loads(pickle.dumps(snap))
    assert received.index_file is None and bytes(received.files.data) == bytes(snap.files.data)
    assert received.files.get("0/d1/f4.bin").size == 5

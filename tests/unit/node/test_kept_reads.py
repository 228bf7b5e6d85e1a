"""A restart's reads across nodes (monarch/node/kept_reads.py): a file another node keeps is fetched
only while it is the PFS file as it stands, a failed or refused fetch reads the PFS, a partner's held
copy is kept once its node's drain applied it; each source counted."""

import os

from monarch.errors import FailureReason, PeerError
from monarch.node.kept_reads import KeptReads, parse_key, peer_key
from monarch.writeback.journal import Record
from monarch.writeback.kept import KeptWrites


class Nodes:
    """Simulated nodes on one machine: each a tier base of its own, the peer plane a call to the
    holder's ``provide`` (its bytes copied into the asker's descriptor)."""

    def __init__(self, tmp_path, n):
        for k in range(n):
            (tmp_path / f"tier{k}").mkdir()
        self.reads = [KeptReads(KeptWrites(str(tmp_path / f"tier{k}"), 1 << 20), None) for k in range(n)]
        self.lost, self.fetched = set(), []
        for k, reads in enumerate(self.reads):
            reads.across(Plane(self, k, n))

    def exchange(self):
        payloads = [r.holdings() for r in self.reads]
        for r in self.reads:
            r.learn(payloads)


class Plane:
    collective = True

    def __init__(self, nodes, node, n):
        self.nodes_, self.node, self.nodes = nodes, node, n

    def is_lost(self, node):
        return node in self.nodes_.lost

    def fetch(self, owner, key, fd, size=None):
        self.nodes_.fetched.append((self.node, owner, parse_key(key)[0]))
        local = self.nodes_.reads[owner].provide(key)
        if local is None:
            raise PeerError(f"node {owner} refused", FailureReason.REFUSED)
        data = open(local, "rb").read()
        os.write(fd, data)
        return len(data)


def publish(tmp_path, reads, name, data):
    """``name`` written to the PFS and kept by ``reads``'s node, as its drain leaves it."""
    local, pfs = tmp_path / "area" / name, tmp_path / "pfs" / name
    for p in (local, pfs):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.utime(pfs, ns=(0, os.stat(local).st_mtime_ns))
    reads.kept.keep(str(pfs), str(local))
    return str(pfs)


def test_a_file_another_node_keeps_is_fetched_once_then_read_here(tmp_path):
    nodes = Nodes(tmp_path, 3)
    pfs = publish(tmp_path, nodes.reads[0], "ck", b"c" * 1000)
    nodes.exchange()
    served = nodes.reads[1].open(pfs)
    assert open(served, "rb").read() == b"c" * 1000 and nodes.fetched == [(1, 0, pfs)]
    assert nodes.reads[1].open(pfs) == served and len(nodes.fetched) == 1  # kept here now
    figures = nodes.reads[1].figures
    assert (figures["restart_peer_files"], figures["restart_tier_files"], figures["restart_pfs_files"]) == (1, 1, 0)
    assert nodes.reads[2].open(pfs) is not None and nodes.reads[2].figures["restart_partner_files"] == 1  # 0 is 2's
    assert nodes.reads[0].open(pfs) is not None and nodes.reads[0].figures["restart_tier_files"] == 1


def test_a_file_changed_on_the_pfs_since_it_was_kept_is_not_fetched(tmp_path):
    nodes = Nodes(tmp_path, 2)
    pfs = publish(tmp_path, nodes.reads[0], "ck", b"old" * 100)
    nodes.exchange()
    with open(pfs, "r+b") as f:
        f.write(b"new")
    assert nodes.reads[1].open(pfs) is None and nodes.fetched == []  # the PFS's new bytes
    assert nodes.reads[1].figures["restart_pfs_files"] == 1
    assert nodes.reads[0].open(pfs) is None  # and the holder's own copy is stale too


def test_a_lost_or_refusing_holder_leaves_the_read_to_the_next_holder_then_the_pfs(tmp_path):
    nodes = Nodes(tmp_path, 3)
    pfs = publish(tmp_path, nodes.reads[1], "ck", b"x" * 10)
    publish(tmp_path, nodes.reads[2], "ck", b"x" * 10)  # (the same bytes and time: both keep them)
    nodes.exchange()
    nodes.lost.add(1)
    assert nodes.reads[0].open(pfs) is not None and nodes.fetched == [(0, 2, pfs)]
    other = publish(tmp_path, nodes.reads[1], "other", b"y" * 10)
    nodes.exchange()
    os.unlink(os.path.join(nodes.reads[1].kept.data, nodes.reads[1].kept._files[other]["name"]))  # gone under it
    nodes.lost.clear()
    assert nodes.reads[2].open(other) is None and nodes.reads[2].figures["restart_pfs_files"] == 1


def test_a_partners_held_copy_is_kept_once_its_node_applied_it(tmp_path):
    nodes = Nodes(tmp_path, 2)
    pfs = tmp_path / "pfs" / "ck"
    pfs.parent.mkdir()
    pfs.write_bytes(b"p" * 64)
    held = tmp_path / "held"
    held.write_bytes(b"p" * 64)
    os.utime(held, ns=(0, os.stat(pfs).st_mtime_ns))  # (the partner's copy takes its node's time)
    rec = Record(7, "close", {"seq": 1, "path": str(pfs), "mode": 0o644, "size": 64})
    nodes.reads[1].partner_published(0, rec, str(held))
    nodes.reads[1].followed()
    os.unlink(held)  # the partner lets its held copy go
    nodes.exchange()
    assert nodes.reads[1].open(str(pfs)) is not None  # its own read: from the copy it held
    served = nodes.reads[0].open(str(pfs))
    assert open(served, "rb").read() == b"p" * 64
    assert nodes.reads[0].figures["restart_partner_files"] == 1 and nodes.fetched == [(0, 1, str(pfs))]


def test_a_copy_kept_later_is_told_to_the_other_nodes_and_read_from_there(tmp_path):
    """A copy kept after the start (a job of the same allocation) is told by its store to the peer
    plane's word (``cluster/holdings.py``), and the other nodes fetch it; a word that is not one is
    dropped, never raised on the engine thread."""
    from monarch.cluster.control import Verb
    from monarch.cluster.holdings import Holdings

    nodes = Nodes(tmp_path, 2)
    nodes.exchange()  # (at the start: nothing kept)
    words = [Holdings(None, k, 2, lambda k: False) for k in range(2)]
    for k, (reads, word) in enumerate(zip(nodes.reads, words)):
        word.listen(reads._heard)
        reads.kept.tell_kept_to(lambda entries, k=k: words[1 - k].handlers()[Verb.KEPT](k, entries))
    pfs = publish(tmp_path, nodes.reads[0], "model.pt", b"w" * 4096)
    served = nodes.reads[1].open(pfs)
    assert served is not None and open(served, "rb").read() == b"w" * 4096 and nodes.fetched == [(1, 0, pfs)]
    words[1].handlers()[Verb.KEPT](0, [["x", "not", "a", "copy"]])  # hostile: dropped, said
    words[1].handlers()[Verb.KEPT](0, "junk")


def test_a_fetch_cut_short_keeps_nothing_and_the_next_holder_serves(tmp_path):
    """A holder that dies mid-file (some bytes written, then the peer plane's error): nothing of it
    is kept or served here, and the next holder's copy is."""
    nodes = Nodes(tmp_path, 3)
    pfs = publish(tmp_path, nodes.reads[1], "ck", b"z" * 5000)
    publish(tmp_path, nodes.reads[2], "ck", b"z" * 5000)
    nodes.exchange()
    plane = nodes.reads[0]._cluster
    whole = plane.fetch

    def dies_from_node_1(owner, key, fd, size=None):
        if owner == 1:
            os.write(fd, b"z" * 100)
            raise PeerError("node 1 lost mid-file", FailureReason.PEER_LOST)
        return whole(owner, key, fd, size)
    plane.fetch = dies_from_node_1
    served = nodes.reads[0].open(pfs)
    assert open(served, "rb").read() == b"z" * 5000 and nodes.fetched == [(0, 2, pfs)]
    assert len(os.listdir(nodes.reads[0].kept.data)) == 1  # the cut copy removed, the whole one kept

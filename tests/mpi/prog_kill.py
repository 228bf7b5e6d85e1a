"""MPI program driven by test_cluster.py: one node is SIGKILLed mid-job.

    mpiexec -disable-auto-cleanup -n N python prog_kill.py VICTIM PFS_DIR WORK_DIR

VICTIM is "first" or "last". Survivors must get PeerError within peer_timeout for the dead
node's files (then at once), keep fetching from each other, and get through finish().
hydra may still kill survivors a moment after the failure (see docs/cluster.md), so each
survivor appends its findings to WORK_DIR/report.<node> (stdout may be gone):
``STEP <name> {json}`` as it gets through, ``FAILED <message>`` on a failed check.
"""

import json
import os
import signal
import sys
import time

from prog_cluster import ToyDaemon, check, fetch_checked, plain_keys, walk

from monarch.cluster import Cluster, abort_on_unhandled_exception
from monarch.errors import PeerError

PEER_TIMEOUT = 1.0


def main():
    which, pfs, base = sys.argv[1:4]
    try:
        run(which, pfs, base)
    except BaseException as exc:
        note(base, f"FAILED {type(exc).__name__}: {exc}")
        raise


_node = [None]


def note(base, line):
    with open(os.path.join(base, f"report.{_node[0]}"), "a") as f:
        f.write(line + "\n")


def run(which, pfs, base):
    abort_on_unhandled_exception()
    cluster = Cluster.from_world(peer_timeout=PEER_TIMEOUT)
    me, nodes = cluster.node, cluster.nodes
    _node[0] = me
    victim = 0 if which == "first" else nodes - 1
    work = os.path.join(base, f"node{me}")
    daemon = ToyDaemon(pfs, os.path.join(work, "tier"))
    os.makedirs(work)
    cluster.start(daemon.provide)
    snapshot = cluster.share(lambda: walk(pfs))
    cluster.share(lambda: None)           # everyone is serving
    time.sleep(0.5)                       # (a kill right at start-up can take hydra down too)
    if me == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.3)

    keys = plain_keys(snapshot)
    theirs = [k for k in keys if cluster.owner(k) == victim]
    check(theirs, "the victim owns no key: use more files")
    t0 = time.monotonic()
    try:
        cluster.fetch(victim, theirs[0], os.path.join(work, "dead"))
    except PeerError:
        first = time.monotonic() - t0
    else:
        raise AssertionError("fetch from a killed node succeeded")
    check(first <= PEER_TIMEOUT + 0.75, f"first PeerError after {first:.2f}s")
    note(base, f"STEP first_error {json.dumps(round(first, 3))}")
    t0 = time.monotonic()
    for key in theirs[1:4]:
        try:
            cluster.fetch(victim, key, os.path.join(work, "dead"))
        except PeerError as exc:
            check("not answering" in str(exc), f"unexpected {exc}")
        else:
            raise AssertionError("fetch from a killed node succeeded")
    again = time.monotonic() - t0
    check(again < 0.5, f"known-dead peer not failed fast: {again:.2f}s")
    note(base, f"STEP fail_fast {json.dumps(round(again, 3))}")

    alive = [k for k in keys if cluster.owner(k) not in (me, victim)]
    got = sum(fetch_checked(cluster, k, os.path.join(work, f"got{i}"), pfs) for i, k in enumerate(alive))
    note(base, f"STEP fetched {json.dumps(len(alive))}")

    t0 = time.monotonic()
    result = cluster.finish({"node": me, "fetched": len(alive), "bytes": got})
    took = time.monotonic() - t0
    check(took < 3 * PEER_TIMEOUT + 2, f"finish() took {took:.1f}s")
    info = {"first_error_s": round(first, 3), "again_s": round(again, 3), "fetched": len(alive), "finish_s": round(took, 2)}
    note(base, f"STEP finish {json.dumps(info)}")
    if me == 0:
        check(result[victim].get("missing") is True, f"victim not marked: {result}")
        check(all(not result[k].get("missing") for k in range(nodes) if k != victim), f"{result}")
        note(base, "STEP result " + json.dumps(result))
    else:
        check(result is None, "finish() returns None off node 0")
    cluster.close()


if __name__ == "__main__":
    main()

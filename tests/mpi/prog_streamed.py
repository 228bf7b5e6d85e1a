"""Streamed share between real ranks: the other nodes get node 0's files while it still walks.

Node 0's "walk" publishes three parts; before it publishes the last one it waits until every
other node has written a file saying it received the first two. Without streaming no node
could see a part before the walk ends, and node 0 would give up (exit 1).
"""

import json
import os
import sys
import time

from monarch.cluster import Cluster, abort_on_unhandled_exception

PARTS = [{"0/a": 1, "0/b": 2}, {"0/c": 3}, {"0/d": 4, "0/e": 5}]


def main():
    work = sys.argv[1]
    abort_on_unhandled_exception()
    cluster = Cluster.from_world()
    me = cluster.node
    seen = []

    def on_files(files):
        seen.append(dict(files))
        if me != 0 and set().union(*seen) == {"0/a", "0/b", "0/c"}:
            open(os.path.join(work, f"got-two-{me}"), "w").close()

    def walk(publish):
        publish(PARTS[0])
        time.sleep(0.1)  # the next part goes in its own broadcast
        publish(PARTS[1])
        deadline = time.monotonic() + 30
        others = [os.path.join(work, f"got-two-{k}") for k in range(1, cluster.nodes)]
        while not all(os.path.exists(p) for p in others):
            if time.monotonic() > deadline:
                print("node 0: the other nodes never saw the walk's first parts", flush=True)
                sys.exit(1)
            time.sleep(0.02)
        publish(PARTS[2])
        return "walked"

    value = cluster.share(walk, on_files=on_files)
    merged = {}
    for part in seen:
        merged.update(part)
    print("RESULT " + json.dumps({"node": me, "value": value, "files": merged}), flush=True)
    cluster.close()


if __name__ == "__main__":
    main()

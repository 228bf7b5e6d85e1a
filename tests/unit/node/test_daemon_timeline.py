"""The daemon's timeline of tier occupancy: each point of ``used.<tier>`` is the bytes the tier
holds, never the room lent to the front door."""

from __future__ import annotations

import os
import threading

import pytest

from monarch import frontdoor, protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.server import NodeServer
from support.harness import NO_RESERVE, unix_connect as connect, make_bases


# -- the timeline's used.<tier> is bytes in the tier, not room lent to the front door -----------

@pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")
def test_the_timeline_counts_bytes_in_the_tier_not_room_lent_to_the_front_door(short_tmp):
    from monarch.layout import MARKER
    root = f"/dev/shm{short_tmp}/pfs" if os.path.isdir("/dev/shm") else os.path.join(short_tmp, "pfs")
    os.makedirs(root)
    sizes = {}
    for i in range(40):
        with open(os.path.join(root, f"f{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(3000 + i))
        sizes[f"0/f{i:03d}.bin"] = 3000 + i
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:  # 1 GiB: the door is lent 16 MiB (LEASE_MAX) at a time
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 1GiB}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 20, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    daemon = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r0")
    server = NodeServer(daemon, embedded=False)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        tier = daemon.tiers[0]

        def in_tier() -> int:
            total = 0
            for dirpath, dirnames, names in os.walk(tier.path):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names
                             if n != MARKER and not n.startswith("."))
            return total

        samples = []
        for key in sizes:
            with connect(daemon.socket_path) as s:
                s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
                while protocol.recv_answer(s)[0] == protocol.STATUS_PENDING:
                    pass
            daemon.absorb_front_door()  # the door's copies in the books, as a report takes them
            daemon._sampler.sample()  # a point of the timeline, as the daemon's sampler takes it
            samples.append((in_tier(), tier.describe()["used"]))
        series = daemon.timeline.to_dict()["series"]["used.ram"]
        assert [u for _, u in samples] == [b for b, _ in samples]  # the tier's used: its copies' bytes
        assert series[-len(samples):] == [b for b, _ in samples]  # every point of the plot, too
        assert series[-1] == sum(sizes.values())
        report_used = next(t for t in daemon.stats()["tiers"] if t["name"] == "ram")["used"]
        assert report_used == series[-1]
    finally:
        server.request_stop()
        thread.join(10)
        daemon.close()

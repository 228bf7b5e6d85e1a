"""The fallbacks of a run: each way the application's processes came to read the dataset without
Monarch, said once with its reason and its fix, as the report's ``fallbacks`` list.

The shim finds four where the application's view of the node differs from the daemon's (a
container, a chroot, another mount namespace: monarch/shim/shim_view.c) and sets their bits in
the counters (it also says each on stderr when it happens); the launcher finds two more from
the counts of processes (monarch/report/bypass.py): no process ran with the shim, or the shim
ran only in processes that never touched the roots (a container runtime's own).
"""

from __future__ import annotations

from typing import Iterable

from monarch import protocol
from monarch.records.node_stats import NodeStats

BIND = "apptainer --bind, podman -v, srun --container-mounts"
# reason -> (the shim's bit or None, what happened, the fix); docs/containers.md explains each
REASONS = {
    "root-elsewhere": (protocol.FALLBACK_ROOT_ELSEWHERE,
                       "a dataset root named other files for the application than for the daemon (a container's "
                       "or chroot's own directory at that path): read directly, not through Monarch",
                       f"bind the daemon's root at the same path ({BIND}), or run the daemon where the job runs"),
    "tiers-unseen": (protocol.FALLBACK_TIERS_UNSEEN,
                     "the daemon's tier folders were not visible to the application (a container's private "
                     "/dev/shm or /tmp): its opens read the PFS",
                     f"bind the tier folders at the same paths ({BIND}), or run `monarch run` inside the container"),
    "daemon-unreachable": (protocol.FALLBACK_DAEMON_UNREACHABLE,
                           "the daemon's run folder was not reachable from the application: it read the dataset "
                           "directly",
                           f"bind the run folder at the same path ({BIND}) and pass the MONARCH_* variables"),
    "uid-mismatch": (protocol.FALLBACK_UID_MISMATCH,
                     "the application ran as another uid than the daemon (a container user mapped elsewhere): it "
                     "read the dataset directly",
                     "run the job as the daemon's user (podman --userns=keep-id; Apptainer and Enroot keep it)"),
    "raw-unwatched": (protocol.FALLBACK_RAW_UNWATCHED,
                      "a process's system calls made without libc could not be watched although the launcher's "
                      "could (a seccomp filter inside the job, a container's): a library that renames or opens a "
                      "write-back file by a raw call may not find it",
                      "run the job's processes under the same seccomp profile as `monarch run`, or set no "
                      "writeback: paths"),
    "writeback-through": (None, "the job's system calls made without libc cannot be watched, so its write-back "
                                "paths were written through: every file there went to the PFS as without Monarch, "
                                "at the PFS's speed",
                          "run the job where the kernel is Linux 5.11 or later on x86_64 with no seccomp filter "
                          f"refusing prctl, and {protocol.ENV_RAW_SYSCALLS} unset or 1"),
    "writeback-daemon-lost": (protocol.FALLBACK_WB_LOST,
                              "the node daemon was lost after it took the job's writes: files it had not published "
                              "are kept in its write-back tier, and a change under the write-back paths since then "
                              "failed (EIO) rather than reach the PFS before them",
                              "`monarch drain` publishes what the daemon kept (on every node at once: the drain "
                              "line); then run the job again"),
    "no-shim": (None, "no process of the command ran with the Monarch shim (LD_PRELOAD dropped, a static "
                      "reader, or the shim could not reach the daemon's run folder or ran as another user: "
                      "its own `monarch:` line said which)",
                "pass LD_PRELOAD and the MONARCH_* variables into the container (podman --env LD_PRELOAD "
                "--env 'MONARCH_*'; Apptainer and Enroot pass the environment), and bind the shim's folder"),
    "shim-idle": (None, "the shim ran only in processes that made no call under the dataset roots (a container "
                        "runtime's own): the readers ran without it, or with it but unable to reach the daemon's "
                        "run folder or as another user (then their own `monarch:` line said which)",
                  "pass LD_PRELOAD and the MONARCH_* variables into the container (podman --env LD_PRELOAD "
                  "--env 'MONARCH_*'), or run `monarch run` inside it"),
}


def entry(reason: str, detail: str = "") -> dict:
    _, what, fix = REASONS[reason]
    return {"reason": reason, "detail": f"{what}{': ' + detail if detail else ''}", "fix": fix}


def shim_fallbacks(alive: Iterable[NodeStats]) -> list[dict]:
    """The fallbacks the shims of every node set, once each (the roots that named other files listed)."""
    bits, elsewhere = 0, []
    for n in alive:
        view = n.view or {}
        bits |= int(view.get("fallbacks", 0))
        elsewhere += [r for r in view.get("roots_elsewhere", ()) if r not in elsewhere]
    return [entry(reason, ", ".join(elsewhere) if reason == "root-elsewhere" else "")
            for reason, (bit, _, _) in REASONS.items() if bit is not None and bits & bit]


def say(fallbacks: list[dict]) -> list[str]:
    """The lines a launcher prints for them."""
    return [f"monarch: fallback ({f['reason']}): {f['detail']}. Fix: {f['fix']}" for f in fallbacks]

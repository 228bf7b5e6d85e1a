"""What the container tests share: the documented blocks of docs/containers.md, how a job is run
from one (bash, in the job's folder, with the host's stand-ins on PATH) and what is asserted of it."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.harness import REPO, load

HERE = Path(__file__).resolve().parent
DOC = Path(REPO) / "docs" / "containers.md"
CONTAINERS_CONF = HERE / "containers.conf"
ROOTLESS_USER = "nobody"  # rootless Podman's user: no subordinate ids, one uid mapped (its own)
OTHER_UID = 1000          # a container user who is not the daemon's


@dataclass
class Image:
    record: dict

    @property
    def rootfs(self) -> str:
        return self.record["rootfs"]

    def podman_image(self, user: str = "root") -> str | None:
        return self.record.get("podman", {}).get(user)

    def podman_home(self, user: str) -> str:
        return self.record["podman_home"][user]


def podman_prefix(image: Image, user: str) -> list[str]:
    """How to run a command as ``user`` with its rootless Podman storage (root: as it is)."""
    if user == "root":
        return []
    home = image.podman_home(user)
    return ["runuser", "-u", user, "--", "env", f"HOME={home}", f"XDG_RUNTIME_DIR={home}/run"]




def doc_block(name: str) -> str:
    """The shell block of docs/containers.md under ``<!-- containers: NAME -->``."""
    text = DOC.read_text()
    m = re.search(rf"<!-- containers: {re.escape(name)} -->\n```sh\n(.*?)```", text, re.S)
    assert m, f"docs/containers.md has no block '{name}'"
    return m[1]


DATASET = "/pfs/datasets/imagenet"
TRAIN = "python train.py"


def reader_line(root: str, manifest: str, epochs: int = 2, workers: int = 2) -> str:
    """The job: every file read once per epoch by forked workers, each digest checked."""
    return (f"python -m monarch.tools.workload read {root} --epochs {epochs} --workers {workers} "
            f"--manifest {manifest}")


@dataclass
class Job:
    rc: int
    out: str
    err: str
    report: dict | None

    def assert_ok(self):
        assert self.rc == 0, f"exit {self.rc}\n{self.out}\n{self.err}"
        assert "MISMATCH" not in self.out and "wrong bytes" not in self.err, self.out + self.err

    def assert_served(self, files: int, epochs: int = 2):
        """Every open from a tier, the PFS read once (by the staging), no fallback."""
        self.assert_ok()
        rep = self.report
        assert rep is not None, self.err
        opened = {k: v["opens"] for k, v in rep["opened_from"].items()}
        assert opened.get("pfs", 0) == 0, (opened, self.err)
        assert sum(opened.values()) == files * epochs, (opened, self.err)
        assert rep["pfs"]["reads_of_dataset"] == pytest.approx(1.0, abs=0.005), (rep["pfs"], self.err)
        assert rep.get("fallbacks", []) == [], rep["fallbacks"]

    def assert_fell_back(self, reason: str, reported: tuple[str, ...] = ()):
        """Bytes right, exit 0, the fallback said once on stderr and in the report with its fix.
        ``reported``: the report's reasons that stand for it where the shim could not tell the
        daemon (a run folder it cannot reach, or not its user's: its own line on stderr says which,
        and the report sees only that no reader ran with it)."""
        self.assert_ok()
        assert self.report is not None, self.err
        reasons = [f["reason"] for f in self.report.get("fallbacks", [])]
        reason_in_report = next((r for r in (reason, *reported) if r in reasons), None)
        assert reason_in_report, (reasons, self.err)
        entry = self.report["fallbacks"][reasons.index(reason_in_report)]
        assert entry["fix"] and entry["detail"], entry
        lines = warned(self.err, reason)
        assert 1 <= len(lines) <= 2, (reason, self.err)  # the shim's or the launcher's line, never one per process


# what each fallback's line on stderr says (besides its reason's name, where the line gives it)
SAID = {
    "root-elsewhere": "is not the dataset root the daemon serves",
    "tiers-unseen": "tier folder",
    "daemon-unreachable": "run folder",
    "uid-mismatch": "another user",
    "no-shim": "no process of the command ran with the Monarch shim",
    "shim-idle": "the shim ran only in processes that made no call under the dataset roots",
}


def warned(stderr: str, reason: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.startswith("monarch: ") and (reason in line or SAID[reason] in line)]


class Runner:
    """Runs a documented block (or one changed from it) in bash from the job's folder, as a user
    types it: the host's ``monarch`` and ``python3`` are this checkout's (bin/), ``apptainer`` and
    ``srun`` the stand-ins in bin/, Podman with this machine's settings (containers.conf)."""

    def __init__(self, image: Image, folder: str, shim_cache: str):
        self.image = image
        self.folder = folder
        self.shim_cache = shim_cache

    def env(self, **extra) -> dict:
        """The job's environment: no PYTHONPATH (it would go into the containers with the rest;
        bin/monarch and bin/python3 put the checkout on their own path)."""
        env = dict(os.environ, PATH=os.pathsep.join([str(HERE / "bin"), os.environ.get("PATH", "")]),
                   MONARCH_TEST_PYTHON=sys.executable, CONTAINERS_CONF=str(CONTAINERS_CONF),
                   XDG_CACHE_HOME=self.shim_cache, TMPDIR=self.folder, MONARCH_JOB_ID=f"ct-{uuid.uuid4().hex[:8]}",
                   MONARCH_PROGRESS="0")
        for k in ("PYTHONPATH", "MONARCH_DISABLE", "MONARCH_NODE", "MONARCH_CLUSTER", "SLURM_JOB_ID", "SLURM_STEP_ID",
                  "SLURM_NODEID"):
            env.pop(k, None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, script: str, report: str | None, user: str = "root", timeout: float = 240, **env) -> Job:
        cmd = [*podman_prefix(self.image, user), "bash", "-c", "set -o pipefail\n" + script]
        r = subprocess.run(cmd, cwd=self.folder, env=self.env(**env), capture_output=True, text=True,
                           timeout=timeout)
        rep = load(report) if report and os.path.exists(report) else None
        return Job(r.returncode, r.stdout, r.stderr, rep)


def substitute(block: str, *, root: str, train: str, image: str) -> str:
    """The documented block with the test's dataset, reader and image."""
    out = block.replace(DATASET, root).replace(TRAIN, train)
    return out.replace("image.sif", image).replace("IMAGE", image)


def job_config(folder: str, root: str, report: str, shared_bases: bool) -> str:
    """``job.yaml`` in ``folder``: the dataset root, the report's path, staging private to the job;
    ``shared_bases``: the run folder and tiers in the test's own folders on the host (bound into
    the container), else the shipped defaults (the container's own /dev/shm and /tmp) but for the
    filesystem reserve, 16 MiB: a quarter of a 64 MiB /dev/shm, as the default's, and a sliver of the
    host's disk under the container's /tmp, however full that disk is."""
    from support.harness import write_config
    if shared_bases:
        made = write_config(folder, root, policy="read-ahead", extra=f"report: {report}\n")
        path = os.path.join(folder, "job.yaml")
        os.rename(made, path)
        return path
    path = os.path.join(folder, "job.yaml")
    with open(path, "w") as f:
        f.write(f'dataset: {{roots: ["{root}"]}}\nstaging: {{share: false}}\nreport: "{report}"\n'
                'filesystem_reserve: 16MiB\n')
    return path


def open_to_all(path: str) -> None:
    """A container user other than root (rootless Podman's, --user) reaches ``path`` and reads under it."""
    while path not in ("/", "/tmp"):
        os.chmod(path, os.stat(path).st_mode | 0o755)
        path = os.path.dirname(path)


def give_to(path: str, user: str) -> None:
    info = pwd.getpwnam(user)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, info.pw_uid, info.pw_gid)

"""A private Slurm on this machine for the tests: munged on its own socket, one
slurmctld and one slurmd per simulated node (``slurmd -N nK``), every port free when chosen,
every spool, state, log and TmpFS directory under one base, every process started here and
ended here.

Why each slurmd reads a slurm.conf of its own: they share one host, and Slurm's PMIx plugin
makes its per-step directory under TmpFS by job and step only (``spmix_appdir_0_J.S``): two
slurmd with one TmpFS collide ("File exists") and the step fails. Their files differ only in
TmpFS; ``DebugFlags=NO_CONF_HASH`` tells slurmctld that this is meant.

Why root: slurmd starts a job's tasks as the job's user (setuid), which needs root; a
non-root slurmd cannot run jobs at all, so the tests are skipped then (``unavailable``).

Every wait is bounded; :meth:`PrivateSlurm.stop` cancels the jobs, waits for their steps to
end, then ends the daemons, and kills any process still holding a file under the base (a
slurmstepd of ours, a task it left): nothing of it outlives the session.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time

BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "salloc", "squeue", "scancel",
            "scontrol", "sinfo")
START_TIMEOUT = 60.0   # munged, slurmctld and the slurmd registering: seconds here, generous on a busy CI
STOP_TIMEOUT = 30.0
CPUS = 2               # per simulated node: --ntasks-per-node 2 fits; the host's cores are shared by all


# Failures of Slurm itself, told by what its daemons print, that no Monarch code can avoid: a
# test that meets one stops waiting at once (never a hang); tests/slurm/jobs.py runs the job
# once more or skips the test with the reason.
KNOWN_BUGS = {
    # Slurm 22.05's PMI-1 server (mpi/pmi2 plugin) takes a request line in one read(): under
    # load MPICH's ~1 KiB "put" of a business-card segment arrives in two pieces, both are
    # refused, and every rank's MPI_Init waits for ever (seen about once in 40 daemon starts
    # here, only while other test suites loaded the machine). MPICH's PMI-2 wire protocol,
    # which Slurm reads by length, fails MPI_Init outright with this MPICH; PMIx is not built in.
    "mpi/pmi2: value not properly terminated in client request":
        "Slurm 22.05's PMI-1 server read an MPICH request in two pieces (its single-read race under load): "
        "MPI_Init of the daemons cannot complete",
}


class KnownSlurmBug(RuntimeError):
    """A failure of Slurm itself (``KNOWN_BUGS``), not of what the test checks."""


def known_bug(text: str) -> str | None:
    return next((why for sign, why in KNOWN_BUGS.items() if sign in text), None)


def unavailable() -> str | None:
    """Why a private Slurm cannot run here (the tests' one-line skip), or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.access(f"/usr/sbin/{b}", os.X_OK)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing: scripts/install.sh installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "a private Slurm needs root here (slurmd starts a job's tasks as its user)"
    return None


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free now on 127.0.0.1 (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class PrivateSlurm:
    """``nodes`` Slurm nodes n1..nN on localhost, partition ``debug``; :attr:`env` is the
    environment every client command (sbatch, salloc, srun, squeue) needs."""

    def __init__(self, base: str, nodes: int = 4, mpi_default: str = "pmi2"):
        self.base = base
        self.nodes = [f"n{k + 1}" for k in range(nodes)]
        self.mpi_default = mpi_default
        self.procs: list[subprocess.Popen] = []
        self.conf = os.path.join(base, "slurm.conf")
        self.munge_socket = os.path.join(base, "munge", "munge.socket")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for var in [v for v in self.env if v.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))]:
            if var != "SLURM_CONF":
                del self.env[var]  # an outer allocation's variables would steer ours

    # -- start -------------------------------------------------------------------------------

    def start(self) -> None:
        for d in ("munge", "state", "log", "spool", "tmpfs"):
            os.makedirs(os.path.join(self.base, d), mode=0o700, exist_ok=True)
        os.chmod(self.base, 0o755)  # munged checks its socket's directory chain
        self._start_munge()
        ports = _free_ports(1 + len(self.nodes))
        self._write_conf(ports[0], ports[1:])
        self._spawn([_binary("slurmctld"), "-D", "-i", "-f", self.conf], "slurmctld")
        for node in self.nodes:
            os.makedirs(os.path.join(self.base, "spool", node), exist_ok=True)
            os.makedirs(os.path.join(self.base, "tmpfs", node), exist_ok=True)
            self._spawn([_binary("slurmd"), "-D", "-N", node, "-f", self._node_conf(node)], f"slurmd.{node}")
        self._wait_idle()

    def _start_munge(self) -> None:
        key = os.path.join(self.base, "munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, os.urandom(1024))
        finally:
            os.close(fd)
        d = os.path.join(self.base, "munge")
        self._spawn([_binary("munged"), "-F", "--force", "-S", self.munge_socket, f"--key-file={key}",
                     f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                    "munged")
        self._wait(lambda: os.path.exists(self.munge_socket), "munged's socket", "munge/munged.log")

    def _write_conf(self, ctld_port: int, node_ports: list[int]) -> None:
        b = self.base
        lines = [
            "ClusterName=monarchtest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={b}/state", f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/slurmctld.pid", f"SlurmdPidFile={b}/spool/slurmd.%n.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log", f"SlurmdLogFile={b}/log/slurmd.%n.log",
            # no cgroups in a container: processes tracked by their parentage, no task binding
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
            f"MpiDefault={self.mpi_default}", "ReturnToService=2", "SlurmdParameters=config_overrides",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "MailProg=/bin/true", "DebugFlags=NO_CONF_HASH",
            "KillWait=30", "InactiveLimit=0", "MinJobAge=2",
            # job ids of their own per session: names MPI derives from them (Open MPI's
            # /dev/shm/sm_segment.<node>.<uid>.<job hash>.<rank>) never meet an earlier session's
            f"FirstJobId={random.randrange(10_000, 5_000_000)}",
            "TmpFS=@TMPFS@",
        ]
        for node, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={CPUS} RealMemory=1000 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        text = "\n".join(lines) + "\n"
        with open(self.conf, "w") as f:
            f.write(text.replace("@TMPFS@", f"{b}/tmpfs"))
        for node in self.nodes:
            with open(self._node_conf(node), "w") as f:
                f.write(text.replace("@TMPFS@", f"{b}/tmpfs/{node}"))

    def _node_conf(self, node: str) -> str:
        return os.path.join(self.base, f"slurm.{node}.conf")

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(os.path.join(self.base, "log", f"{name}.out"), "wb")
        try:
            self.procs.append(subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True))
        finally:
            out.close()

    def _wait_idle(self) -> None:
        def idle() -> bool:
            res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, check=False)
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            return all(states.get(n) == "idle" for n in self.nodes)
        self._wait(idle, f"{len(self.nodes)} idle nodes", "log/slurmctld.log")

    def _wait(self, ready, what: str, log: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0].args[0]} exited with {dead[0].returncode}" if dead else f"not within {timeout:.0f} s"
                raise RuntimeError(f"private Slurm: no {what} ({why}); see {self.base}/{log}:\n{self.tail(log)}")
            time.sleep(0.2)

    # -- use -----------------------------------------------------------------------------------

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        """A client command (sinfo, squeue, scontrol...) against this Slurm, bounded."""
        try:
            res = subprocess.run(argv, env=env or self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"private Slurm: {' '.join(argv)} took more than {timeout} s") from e
        if check and res.returncode != 0:
            raise RuntimeError(f"private Slurm: {' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
        return res

    def job_state(self, job: str) -> str:
        res = self.run(["scontrol", "-o", "show", "job", job], timeout=10, check=False)
        for field in res.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"  # purged (MinJobAge): it ended

    def wait_job(self, job: str, timeout: float, output=None) -> str:
        """Wait for job ``job`` to end; its final state (COMPLETED, FAILED, ...). A job still
        running after ``timeout`` is cancelled and RuntimeError raised; one whose ``output()``
        shows a known bug of Slurm (``KNOWN_BUGS``) is cancelled at once and KnownSlurmBug raised."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return state
            why = known_bug(output()) if output is not None else None
            if why is not None:
                self.run(["scancel", job], check=False)
                raise KnownSlurmBug(why)
            if time.monotonic() > deadline:
                self.run(["scancel", job], check=False)
                raise RuntimeError(f"private Slurm: job {job} still {state} after {timeout:.0f} s (cancelled)")
            time.sleep(0.5)

    def steps(self, job: str) -> list[str]:
        res = self.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], timeout=10, check=False)
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]

    def tail(self, rel: str, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.base, rel), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    # -- stop ----------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Cancel every job, end every daemon; the pids of processes that had to be killed
        after the daemons ended (a leak: the caller may assert none)."""
        if any(p.poll() is None for p in self.procs):
            self.run(["scancel", "--user", str(os.getuid())], timeout=10, check=False)
            deadline = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < deadline:
                res = self.run(["squeue", "-h", "-o", "%i"], timeout=10, check=False)
                if res.returncode == 0 and not res.stdout.strip() and not self._holders():
                    break
                time.sleep(0.3)
        for p in reversed(self.procs):  # the slurmd, then slurmctld, then munged
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        left = self._holders()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return [str(pid) for pid in left]

    def _holders(self) -> list[int]:
        """Processes other than ours whose working directory or open files are under the base
        (a slurmstepd keeps its socket in the spool, a task its cwd): this Slurm's only."""
        mine = {os.getpid()} | {p.pid for p in self.procs if p.poll() is None}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in mine:
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) in mine:
                        continue  # a daemon's own helper (slurmctld's slurmscriptd): ends with it
                links = [os.readlink(f"/proc/{entry}/cwd")]
                links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            except OSError:
                continue
            if any(link == self.base or link.startswith(self.base + "/") for link in links):
                found.append(int(entry))
        return found

"""Monarch's daemons under Slurm: the one step that works, built from the
allocation (``monarch serve --slurm``), its clean stop, and the wrong launches caught at start
with one line that names the fix.

The step that works: one daemon per node (``-N n -n n --ntasks-per-node=1``, whatever
--ntasks-per-node the allocation has: srun otherwise takes the job's SLURM_NTASKS and puts
two daemons on a node), ``--overlap`` (the training's step may hold every CPU: without it the
daemons' step waits for them, "Requested nodes are busy", for ever), ``--kill-on-bad-exit=0``
(a lost daemon costs its share, the others serve on), and the PMI the daemons' MPI speaks:
PMI2 for MPICH (the ``mpich`` wheel aborts under PMIx), PMIx for Open MPI 5 (which has no
PMI2), Open MPI preferred when installed (scripts/install.sh; ``MONARCH_MPI_ENGINE=mpich``
keeps MPICH).

The stop: srun answers SIGTERM by SIGKILLing its tasks (no report, copies left), so ``monarch
serve --slurm`` keeps srun out of its signals (a session of its own) and turns a SIGTERM or
Ctrl-C into ``scancel --signal=TERM JOB.STEP``: each daemon gets SIGTERM from its slurmstepd,
stops as ``monarch stop`` would, and node 0 writes the cluster report. ``scancel
--signal=TERM JOB`` and the end of a batch script reach the daemons the same way.

Nothing here imports MPI; the environment is read on call.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping

from monarch.errors import MonarchError
from monarch.launch.service import python_command

log = logging.getLogger(__name__)

PMI2, PMIX, NONE = "pmi2", "pmix", "none"
MPICH, OPENMPI = "mpich", "openmpi"
STEP_NAME = "monarch-serve"
FIX = "start them with `monarch serve --slurm -c CONFIG` (docs/cluster.md)"
SLURM_TIMEOUT = 30.0      # srun --mpi=list, squeue, scancel: answered by slurmctld in well under a second
STOP_GRACE = 300.0        # the daemons' clean stop (finish(), the report, their tiers removed) once signalled
# A SIGTERM that reaches a daemon before its interpreter has run monarch serve's first lines
# kills it (no report, its peers left waiting); after that it is kept until the daemon serves
# (service.catch_stop_signals). So a stop asked right at the start waits until the step has
# existed this long: its interpreters start in well under a second here, a loaded node is slower.
STEP_SETTLE = 5.0


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    """In a Slurm allocation (a batch script, salloc's shell) but not in one of its steps."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID")) and env.get("SLURM_STEP_ID", "") in ("", "batch", "extern") \
        and env.get("SLURM_STEPID", "") in ("", "batch", "extern")


def wants_step(env: Mapping[str, str] | None = None) -> bool:
    """Should a plain ``monarch serve`` build the daemons' step itself? In an allocation of
    several nodes, outside a step: one daemon on the batch host alone would serve one node of
    them, never what was meant. (One node: a local daemon, as outside Slurm.)"""
    env = os.environ if env is None else env
    return in_allocation(env) and (_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1) > 1


def launched_by_srun(proc: str = "/proc") -> bool:
    """Is this process a task srun started (its nearest launcher ancestor is slurmstepd, not
    hydra's or Open MPI's: those ranks sit in a Slurm step too, but their PMI is not Slurm's)?"""
    from monarch.topology import _ancestor
    found = _ancestor(frozenset({"slurmstepd", "hydra_pmi_proxy", "prted", "orted", "mpiexec", "mpirun"}), proc)
    if found is None:
        return False
    try:
        with open(f"{proc}/{found[0]}/comm") as f:
            return f.read().strip().startswith("slurmstepd")
    except OSError:
        return False


# -- which MPI the daemons speak --------------------------------------------------------------

def daemon_mpi(env: Mapping[str, str] | None = None) -> str:
    """The MPI mpi4py will load in a daemon started with ``env``: Open MPI when MPI4PY_LIBMPI
    names its library (libmpi.so.40), else MPICH (the ``mpich`` wheel, mpi4py's default here)."""
    env = os.environ if env is None else env
    from monarch.cluster.world import OPENMPI_LIB
    return OPENMPI if os.path.basename(env.get("MPI4PY_LIBMPI", "")).startswith(OPENMPI_LIB) else MPICH


def srun_mpi_plugins(env: Mapping[str, str] | None = None) -> set[str]:
    """The MPI plugins this Slurm offers (``srun --mpi=list``): pmi2, pmix, none, ..."""
    try:
        res = subprocess.run(["srun", "--mpi=list"], env=dict(os.environ if env is None else env),
                             capture_output=True, text=True, timeout=SLURM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MonarchError(f"monarch serve --slurm: `srun --mpi=list` failed ({e}): is Slurm's srun on PATH?") from None
    names = set()
    for line in (res.stdout + res.stderr).splitlines():
        word = line.strip().split(":")[-1].strip()
        if line[:1].isspace() and word and " " not in word:
            names.add(word)
    return names


# -- the step (monarch serve --slurm) --------------------------------------------------------

@dataclass
class Step:
    argv: list[str]
    mpi: str                                   # srun's --mpi
    engine: str                                # the daemons' MPI
    env: dict[str, str] = field(default_factory=dict)


def daemon_step(serve_args: list[str], env: Mapping[str, str] | None = None,
                plugins: set[str] | None = None, verbose: int = 0, command: str = "serve") -> Step:
    """The srun line of this allocation's daemons: ``serve_args`` are ``monarch serve``'s own
    arguments (without --slurm), ``verbose`` the -v count. ``command``: another command run the
    same way, one task a node under the daemons' MPI (``drain``: the nodes' drains together; a task
    that dies ends the others, whose waits on it would never end: the line is run again)."""
    env = os.environ if env is None else env
    who = f"monarch {command} --slurm"
    nodes = _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if not env.get("SLURM_JOB_ID") or nodes is None:
        raise MonarchError(f"{who}: not in a Slurm allocation (no SLURM_JOB_ID, SLURM_JOB_NUM_NODES): "
                           "run it in the batch script or salloc's shell, or start the daemons with mpiexec")
    if not in_allocation(env):
        raise MonarchError(f"{who}: already in a job step (SLURM_STEP_ID is set): run it from the "
                           "batch script or salloc's shell, not under srun (it starts the daemons' step itself)")
    plugins = srun_mpi_plugins(env) if plugins is None else plugins
    from monarch.cluster.world import MPICH as FORCE_MPICH, OPENMPI_LIB, openmpi_prefix
    prefix = openmpi_prefix(env) if env.get("MONARCH_MPI_ENGINE", "") != FORCE_MPICH else None
    if prefix is not None and PMIX in plugins:
        # Open MPI 5 speaks PMIx only; ULFM on, as mpiexec --with-ft ulfm would (a lost node must not end the job)
        extra = {"MPI4PY_LIBMPI": os.path.join(prefix, "lib", OPENMPI_LIB), "OPAL_PREFIX": prefix,
                 "OMPI_MCA_mpi_ft_enable": "1"}
        mpi, engine = PMIX, OPENMPI
    elif PMI2 in plugins:
        extra, mpi, engine = {}, PMI2, MPICH
        if prefix is not None:
            log.info("Open MPI found at %s but this Slurm has no PMIx plugin: the daemons use MPICH under PMI2", prefix)
    else:
        raise MonarchError(f"{who}: this Slurm offers neither PMI2 nor PMIx (srun --mpi=list: "
                           f"{', '.join(sorted(plugins)) or 'nothing'}): the daemons' MPI needs one of them")
    name = STEP_NAME if command == "serve" else f"monarch-{command}"
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap",
            f"--kill-on-bad-exit={int(command != 'serve')}", f"--mpi={mpi}", f"--job-name={name}", "--export=ALL",
            *python_command("monarch"), *["-v"] * verbose, command, *serve_args]
    return Step(argv, mpi, engine, extra)


def serve_step(step: Step, signalled: list[int], out=None) -> int:
    """Run the daemons' step until it ends; the first SIGTERM or SIGINT (appended to
    ``signalled`` by the caller's handlers, taken from its start: service.catch_stop_signals)
    stops it cleanly (``scancel --signal=TERM`` of the step: every daemon stops, node 0 writes
    the report), a second one ends it at once. srun's exit code."""
    out = sys.stderr if out is None else out
    log.info("the daemons' step: %s", " ".join(step.argv))
    # a session of its own: a Ctrl-C or a kill of the batch script's process group must not
    # reach srun, which would SIGKILL the daemons
    proc = subprocess.Popen(step.argv, env={**os.environ, **step.env}, start_new_session=True)
    job = os.environ.get("SLURM_JOB_ID", "")
    handled = 0              # signals acted upon
    deadline = None          # srun must have ended by then, once the step was signalled
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if len(signalled) > handled:
            at_once = handled > 0  # a second signal: cancel the step now
            steps, running = _daemon_steps(job, out)
            if steps and (at_once or running >= STEP_SETTLE):
                _signal_steps(steps, None if at_once else "TERM", out)
                handled = len(signalled)
                deadline = time.monotonic() + (SLURM_TIMEOUT if at_once else STOP_GRACE)
            else:
                time.sleep(0.5)  # the step is not there yet, or just started: try again
        if deadline is not None and time.monotonic() > deadline:
            out.write("monarch: the daemons' step did not end after the stop: cancelling it\n")
            _signal_steps(_daemon_steps(job, out)[0], None, out)
            proc.kill()
            return proc.wait(timeout=SLURM_TIMEOUT)


def _daemon_steps(job: str, out) -> tuple[list[str], float]:
    """The daemons' step of this job (JOB.STEP), found by its name ([] if not there yet), and
    the seconds it has been running (squeue's %M: [D-][H:]M:SS)."""
    try:
        res = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j %M"], capture_output=True, text=True,
                             timeout=SLURM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        out.write(f"monarch: squeue failed ({e}): cannot find the daemons' step to stop it\n")
        return [], 0.0
    steps, running = [], 0.0
    for fields in (line.split() for line in res.stdout.splitlines()):
        if len(fields) == 3 and fields[1] == STEP_NAME:
            steps.append(fields[0])
            running = max(running, _elapsed(fields[2]))
    return steps, running


def _elapsed(text: str) -> float:
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + (float(part) if part.isdigit() else 0.0)
    return seconds + (int(days) * 86400 if days.isdigit() else 0)


def _signal_steps(steps: list[str], sig: str | None, out) -> None:
    """``scancel --signal=SIG JOB.STEP`` (``sig`` None: cancel them)."""
    for step in steps:
        cmd = ["scancel", *([f"--signal={sig}"] if sig else []), step]
        try:
            subprocess.run(cmd, capture_output=True, timeout=SLURM_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            out.write(f"monarch: {' '.join(cmd)} failed ({e})\n")
    if steps:
        out.write(f"monarch: {'stopping' if sig else 'cancelling'} the daemons' step {', '.join(steps)}"
                  f"{' (node 0 writes the report)' if sig else ''}\n")
        out.flush()


# -- wrong launches, caught at start (each daemon of a step srun started) ----------------------

def wrong_launch(env: Mapping[str, str] | None = None, engine: str | None = None) -> str | None:
    """Why this srun step of daemons cannot work, in one line that names the fix; None: fine."""
    env = os.environ if env is None else env
    tasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    if tasks is None or nodes is None:
        return None
    if tasks > nodes:
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "?"
        return (f"srun started {tasks} daemons on {nodes} nodes (tasks per node: {per_node}); one per node is "
                f"needed (launchers would attach to the wrong one, `monarch stop` find none): srun -n {nodes} "
                f"--ntasks-per-node=1 --overlap --kill-on-bad-exit=0, or {FIX}")
    mpi = env.get("SLURM_MPI_TYPE", "")
    has_pmi = any(env.get(v) for v in ("PMI_FD", "PMI_PORT", "PMIX_RANK", "PMIX_NAMESPACE"))
    engine = engine or daemon_mpi(env)
    if tasks > 1 and (mpi == NONE or not has_pmi):
        want = PMIX if engine == OPENMPI else PMI2
        return (f"srun started {tasks} daemons without PMI (--mpi={mpi or 'none'}): each would be an MPI world "
                f"of 1 and the second would refuse to start; give srun --mpi={want}, or {FIX}")
    if mpi.startswith(PMIX) and engine == MPICH:
        return ("srun --mpi=pmix, but the daemons' MPI is MPICH (the mpich wheel), which aborts under PMIx "
                f"(\"unsupported PMI version\"); give srun --mpi=pmi2, or {FIX} (it picks Open MPI under PMIx "
                "when scripts/install.sh installed it)")
    if mpi == PMI2 and engine == OPENMPI:
        return (f"srun --mpi=pmi2, but the daemons' MPI is Open MPI (MPI4PY_LIBMPI), which speaks PMIx only; "
                f"give srun --mpi=pmix, or {FIX}")
    return None


def world_of_one(size: int, env: Mapping[str, str] | None = None) -> str | None:
    """After MPI_Init: a world of 1 while srun started several daemons (a PMI MPI did not find)."""
    env = os.environ if env is None else env
    tasks = _int(env, "SLURM_STEP_NUM_TASKS")
    if size == 1 and tasks is not None and tasks > 1:
        return (f"MPI sees a world of 1 while srun started {tasks} daemons: the daemons' MPI found no PMI it "
                f"speaks (srun --mpi={env.get('SLURM_MPI_TYPE') or '?'}); give srun --mpi=pmi2 for MPICH, "
                f"--mpi=pmix for Open MPI, or {FIX}")
    return None


def refuse_wrong_launch(load_config, env: Mapping[str, str] | None = None) -> None:
    """A daemon srun started: if the step cannot work, leave its one-line reason where this
    node's launchers look (they give up waiting at once and say it) and end: task 0 says it
    (MonarchError: exit 2), the others exit 2 quietly, so the step prints it once."""
    env = os.environ if env is None else env
    _refuse(wrong_launch(env), load_config, env)


def refuse_world_of_one(load_config) -> None:
    """After MPI_Init: a world of 1 in a step of several daemons ends every one of them, said
    once and left for the launchers (as ``refuse_wrong_launch``)."""
    from monarch.cluster.world import load_mpi
    _refuse(world_of_one(load_mpi().COMM_WORLD.Get_size()), load_config, os.environ)


def _refuse(why: str | None, load_config, env: Mapping[str, str]) -> None:
    if why is None:
        return
    node = env.get("SLURM_NODEID", "0")
    os.environ["MONARCH_NODE"] = node  # this node's directories, as its launchers name them
    try:
        note(load_config(), why)
    except (MonarchError, OSError) as e:
        log.debug("no note for the launchers: %s", e)
    if env.get("SLURM_PROCID", "0") != "0":
        raise SystemExit(2)
    raise MonarchError(f"monarch serve (Slurm step, node {node}): {why}")


def _refusal_path(config) -> str:
    from monarch import layout
    from monarch import topology
    return os.path.join(layout.run_dir(config.run_base, topology.job_id(), topology.node_index()), layout.REFUSED)


def note(config, why: str, path: str | None = None) -> None:
    """Leave ``why`` where this node's launchers look (``refusal``): at ``path``, else in the
    node's run directory of this job."""
    from monarch import secure
    secure.write_file_atomically(path or _refusal_path(config), why.encode() + b"\n")


def clear_refusal(config) -> None:
    try:
        os.unlink(_refusal_path(config))
    except (OSError, MonarchError):
        pass


def refusal(run_dir: str) -> str | None:
    """The reason this node's daemon of the job will not come (a wrong srun line), or None."""
    from monarch import layout
    try:
        with open(os.path.join(run_dir, layout.REFUSED), errors="replace") as f:
            return f.read(4096).strip() or None
    except OSError:
        return None


# -- a daemons' step that cannot start, seen by a launcher that waits for it -------------------
# srun's step without --overlap while the training's step holds the node's CPUs: srun says
# "step creation temporarily disabled ... Requested nodes are busy" and waits, and Slurm lists
# the step as JOB.TDB, State=PENDING (scontrol show step), until the training's step ends.
PENDING_FIRST = 5.0    # a launcher that has waited this long for its node's daemon asks Slurm about the job's steps
PENDING_EVERY = 5.0    # then this often (the node's first rank only: one request to slurmctld per node)
PENDING_FOR = 10.0     # a step pending this long on this node while its daemon is absent: it waits for CPUs


@dataclass
class JobStep:
    step: str     # JOB.STEP (JOB.TDB while pending)
    state: str    # RUNNING, PENDING, ...
    nodes: str    # its NodeList, a hostlist expression
    srun: str     # its srun's host:pid


def job_steps(job: str) -> list[JobStep] | None:
    """The steps of ``job``, pending ones included (``scontrol -o show step JOB``); None: Slurm
    did not answer."""
    try:
        res = subprocess.run(["scontrol", "-o", "show", "step", job], capture_output=True, text=True,
                             timeout=SLURM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("scontrol show step %s: %s", job, e)
        return None
    if res.returncode != 0:
        log.debug("scontrol show step %s: exit %d: %s", job, res.returncode, res.stderr.strip())
        return None
    steps = []
    for line in res.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "StepId" in fields:
            steps.append(JobStep(fields["StepId"], fields.get("State", ""), fields.get("NodeList", ""),
                                 fields.get("SrunHost:Pid", "")))
    return steps


def expand_hostlist(text: str) -> list[str] | None:
    """``n[1-3,5],m2`` -> n1 n2 n3 n5 m2 (Slurm's hostlist: one bracket per name, ranges keep
    their zero padding); None if ``text`` is not of that form."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        m = re.fullmatch(r"([^\[\]]*)(?:\[([^\]]*)\])?([^\[\]]*)", part)
        if m is None:
            return None
        head, ranges, tail = m.groups()
        if ranges is None:
            names.append(part)
            continue
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return None
            names += [f"{head}{k:0{len(lo)}d}{tail}" for k in range(int(lo), int(hi or lo) + 1)]
    return names


def srun_command(srun: str, proc: str = "/proc") -> list[str] | None:
    """The command line of the srun at ``host:pid`` when it runs on this host (else None)."""
    host, _, pid = srun.rpartition(":")
    if not pid.isdigit() or host.split(".")[0] != socket.gethostname().split(".")[0]:
        return None
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            argv = [os.fsdecode(a) for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    return argv if argv and os.path.basename(argv[0]) == "srun" else None


def _runs_monarch_serve(argv: list[str]) -> bool:
    names = [os.path.basename(a) for a in argv]
    return "serve" in argv and ("monarch" in names or "monarch" in argv)


class PendingDaemons:
    """Under Slurm, for a launcher waiting for its node's daemon: is the daemons' step pending
    (its srun waits for CPUs the training's step holds, and will until that step ends)? Asks
    Slurm after PENDING_FIRST, then every PENDING_EVERY; a step of the job pending on this node
    for PENDING_FOR is the daemons' when its srun runs ``monarch serve`` (seen when its srun
    runs on this host), or when no other step of the job runs that could hold them."""

    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        # MONARCH_JOB_ID set by hand: the daemons may be another allocation's
        self.job = env.get("SLURM_JOB_ID") if not env.get("MONARCH_JOB_ID") else None
        step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
        self.own = {f"{self.job}.{s}" for s in ("batch", "extern", step) if s}
        self.node = env.get("SLURMD_NODENAME") or ""
        self._next = PENDING_FIRST
        self._since: dict[str, float] = {}   # srun host:pid -> seconds waited when first seen pending

    def check(self, waited: float) -> str | None:
        """``waited``: seconds this launcher has waited. Why the daemons will not come, or None."""
        if not self.job or waited < self._next:
            return None
        self._next = waited + PENDING_EVERY
        steps = job_steps(self.job)
        if steps is None:
            return None
        pending = [s for s in steps if s.state == "PENDING" and self._here(s)]
        self._since = {s.srun: self._since.get(s.srun, waited) for s in pending}
        others_run = any(s.state == "RUNNING" and s.step not in self.own for s in steps)
        for s in pending:
            if waited - self._since[s.srun] < PENDING_FOR:
                continue
            argv = srun_command(s.srun)
            if argv is not None and not _runs_monarch_serve(argv):
                continue  # some other step of the job waits: not the daemons'
            if argv is None and others_run:
                continue  # another running step may be the daemons' (still starting)
            what = f"`{' '.join(argv)}`" if argv is not None else f"step {s.step} (srun {s.srun})"
            return (f"the daemons' step cannot start: {what} has been pending for {waited - self._since[s.srun]:.0f} s "
                    f"(\"Requested nodes are busy\": a step without --overlap waits for the CPUs the training's "
                    f"step holds until it ends); {FIX}, or give their srun --overlap")
        return None

    def _here(self, step: JobStep) -> bool:
        names = expand_hostlist(step.nodes) if step.nodes else None
        return not self.node or names is None or self.node in names

"""Every ``MONARCH_*`` environment variable, declared once: name, kind, default, one line of
doc, who reads it, and who sets it (the user, or Monarch for its own children).

``monarch run --help`` and ``monarch serve --help`` print their environment section from this
table (:func:`help_text`), docs/configuration.md's environment table is generated from it (:func:`table`,
``python3 scripts/config_table.py``) and ``tests/unit/test_environment.py`` fails on any read
of a ``MONARCH_*`` name in monarch/ (Python or C) that is not declared here.

This module imports nothing from monarch, so that every floor (launcher, daemon, shim build,
scripts) can use it; the modules that read a variable keep their own constant for its name
(``protocol.ENV_SOCKET``, ``progress.ENV_PROGRESS``; ``MONARCH_ENV_*`` in monarch/wire/monarch_wire.h)
and the test holds those to this table. Nothing here reads the environment.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

# who reads a variable
LAUNCHER = "launcher"          # monarch run (monarch/launch/)
DAEMON = "daemon"              # monarch serve, the node daemon (monarch/node/, monarch/cluster/)
CONFIG = "configuration"       # expanded in a configuration file (${VAR}; the shipped defaults use it)
SHIM = "shim (C)"              # libmonarch_shim.so, in the application's processes
FRONT_DOOR = "front door (C)"  # the daemon's C front door (monarch/frontdoor/)
HINTS = "monarch.hints"        # the hints API, in the application's processes
WORKLOAD = "monarch.tools.workload"  # the demo's and benchmarks' reader
DEMO = "demo"                  # monarch demo
TESTS = "tests and benchmarks"  # tests/, scripts/ (and the helpers in monarch they use)

# who sets it
USER = "user"                  # users set it (a default applies when it is unset)
MONARCH = "monarch"            # Monarch sets it for its own children; never set it by hand
BOTH = "user or monarch"       # users may set it; Monarch sets it for its children too


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str                  # bool, int, float, ms, path, paths, str
    default: str | None        # as it would be written; None: unset means "not given"
    doc: str                   # one line
    readers: tuple[str, ...]
    set_by: str = USER
    form: str = ""             # how the help shows it: "=1", "=1..3" (after the name)
    in_help: bool | None = None  # None: shown when users set it (and not only for tests)

    @property
    def user_facing(self) -> bool:
        """Does ``monarch run --help`` show it?"""
        if self.in_help is not None:
            return self.in_help
        return self.set_by in (USER, BOTH) and set(self.readers) != {TESTS}


VARIABLES: tuple[Variable, ...] = (
    # -- what users set ---------------------------------------------------------------------
    Variable("MONARCH_DATASET", "path", "", "the dataset root of the default configuration (no -c, no --dataset)",
             (CONFIG,), BOTH),
    Variable("MONARCH_WRITEBACK", "paths", None,
             "write-back directories, separated by ':', replacing writeback.paths (empty: none): a file the job "
             "creates or truncates there lands in a node tier and drains to the PFS, whole and in order; set by "
             "monarch run for CMD's processes too", (LAUNCHER, DAEMON, SHIM), BOTH),
    Variable("MONARCH_STORE_PASSWORD", "str", None,
             "the password of the key-value stores in dataset.stores and of monarch store (never printed; "
             "never put it in a URL)", (LAUNCHER, DAEMON)),
    Variable("MONARCH_STORE_PASSWORD_FILE", "path", None,
             "a file readable by you alone whose first line is the stores' password (as ?password_file=PATH)",
             (LAUNCHER, DAEMON)),
    Variable("MONARCH_SSD", "path", "${TMPDIR:-/tmp}",
             "the base of the default configuration's SSD tier and peer area", (CONFIG,)),
    Variable("MONARCH_JOB_ID", "str", None,
             "the run's identity, which keeps runs on a node apart (default: the scheduler's job and step, "
             "SLURM_JOB_ID.SLURM_STEP_ID, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID, COBALT_JOBID; else the MPI "
             "launcher's job; else a new one per outermost monarch run: two runs side by side never share "
             "a daemon, the ranks of one mpiexec on a node do)",
             (LAUNCHER, DAEMON, CONFIG), BOTH),
    Variable("MONARCH_NODE", "int", None,
             "this node's index (else SLURM_NODEID, OMPI_COMM_WORLD_NODE_RANK, PMIX_NODEID; else 0); "
             "a standing daemon sets it to its MPI rank",
             (LAUNCHER, DAEMON, CONFIG), BOTH),
    Variable("MONARCH_RUN_ID", "str", None, "set by monarch run for CMD: a nested monarch run joins this run",
             (LAUNCHER, DAEMON), MONARCH, in_help=True),
    Variable("MONARCH_CLUSTER", "bool", None,
             "=1: this run attaches to its node's standing monarch serve (waits for it); =0: it runs "
             "single-node (default: a cluster when the node index is given and -c has a peer section)",
             (LAUNCHER,), form="=0|1"),
    Variable("MONARCH_CLUSTER_WAIT", "float", "300",
             "seconds a cluster run waits for its node's daemon before CMD reads the PFS directly", (LAUNCHER,)),
    Variable("MONARCH_DISABLE", "bool", None, "the shim passes every open through: CMD reads the PFS directly",
             (SHIM,), BOTH, form="=1"),
    Variable("MONARCH_SHIM_DEBUG", "int", "0", "the shim says what it does, on stderr", (SHIM,), form="=1..3"),
    Variable("MONARCH_SHIM_TIMEOUT_MS", "ms", "60000",
             "how long an open waits for the daemon before reading the PFS", (SHIM,)),
    Variable("MONARCH_SHIM_INDEX_WAIT_MS", "ms", "300",
             "how long one call under a root waits for the snapshot index while the daemon walks; then "
             "that call reads the PFS (counted) and the index is used as soon as it is written", (SHIM,)),
    Variable("MONARCH_SHIM_ZSTD", "str", None,
             "=0: the shim leaves compressed copies to the daemon; a path: the libzstd to load "
             "(default: the system's libzstd.so.1)", (SHIM,)),
    Variable("MONARCH_SHIM_MAP_GUARD", "str", None,
             "=0: a cluster's large-file mappings are not guarded, their faults on blocks not yet local "
             "read the PFS (for a program that installs its SIGSEGV handler with a raw syscall, or whose "
             "memory another process reads with process_vm_readv: docs/cluster.md)", (SHIM,)),
    Variable("MONARCH_SHIM_RAW_SYSCALLS", "str", None,
             "=1: the shim answers the system calls libraries make without libc (Rust's rustix, Go) for every "
             "job, the dataset's opens too; =0: never (a job with write-back paths then writes them through, to the PFS "
             "directly); unset: for a job with write-back paths "
             "(docs/consistency.md, \"Calls Monarch cannot see\")", (SHIM,)),
    Variable("MONARCH_PROGRESS", "bool", None,
             "=0: no live progress (as --no-progress); =1: on every local rank, not only the first",
             (LAUNCHER,), form="=0|1"),
    Variable("MONARCH_PROGRESS_INTERVAL", "float", None,
             "seconds between progress lines (default 1 on a terminal, else 5; at least 1)", (LAUNCHER,)),
    Variable("MONARCH_FRONT_DOOR", "bool", "1", "the daemon answers its socket from Python alone (no C front door)",
             (DAEMON,), form="=0"),
    Variable("MONARCH_C_WALK", "bool", "1", "the daemon walks the dataset in Python (no C walker; slower per file)",
             (DAEMON,), form="=0"),
    Variable("MONARCH_PEER_DATAPATH", "bool", "1",
             "staged files cross between daemons through Python's protocol alone (no C data path)",
             (DAEMON,), form="=0"),
    # -- what Monarch sets for the application's processes (the ATTACH answer, protocol.py) --
    Variable("MONARCH_ROOTS", "str", None, "the dataset roots, as <k>=<dir> entries separated by ':'",
             (SHIM, HINTS), MONARCH),
    Variable("MONARCH_PROBE", "str", None, "the staged-copy directories the shim probes, as <slot>=<dir> pairs",
             (SHIM,), MONARCH),
    Variable("MONARCH_SOCKET", "path", None, "the daemon instance's socket, for the shim and the hints API",
             (SHIM, HINTS, LAUNCHER), MONARCH),
    Variable("MONARCH_COUNTERS", "path", None, "the run's shared counters file", (SHIM, LAUNCHER, WORKLOAD), MONARCH),
    Variable("MONARCH_INDEX", "path", None, "the snapshot index the shim's fstat answers from", (SHIM,), MONARCH),
    Variable("MONARCH_WRITEBACK_MARKS", "path", None,
             "the paths where the job's view of its write-back paths differs from the PFS (the only ones the shim "
             "asks the daemon for)", (SHIM,), MONARCH),
    Variable("MONARCH_WRITEBACK_SOCKET", "path", None, "the socket of the shim's write-back calls", (SHIM,), MONARCH),
    Variable("MONARCH_ASK_FIRST", "bool", None, "=1: every managed open asks the daemon first (validate: open)",
             (SHIM,), MONARCH),
    Variable("MONARCH_STORE_ROOTS", "str", None,
             "the roots served from a key-value store, as root indices separated by ',': an open there that the "
             "daemon cannot serve fails with EIO (there is no PFS file to fall back to)", (SHIM,), MONARCH),
    Variable("MONARCH_SHARED_SLOTS", "str", None,
             "the tier slots shared with the user's other jobs of the dataset, separated by ',': a copy there is "
             "opened only if its size and mtime are this job's snapshot's", (SHIM,), MONARCH),
    Variable("MONARCH_ROOT_IDS", "str", None,
             "each root's device and inode as the daemon sees it, as <k>=<dev>,<ino> entries separated by ':': "
             "a root that is another filesystem object for the application (a container's own /data) is read "
             "directly, said once", (SHIM,), MONARCH),
    Variable("MONARCH_PROBE_IDS", "str", None,
             "each tier folder's device and inode as the daemon sees it, as <slot>=<dev>,<ino> entries: a folder "
             "the application does not see is not probed, said once", (SHIM,), MONARCH),
    Variable("MONARCH_SHIM_SAID", "int", None,
             "the fallbacks a parent process's shim already said on stderr (bits): its children do not say them "
             "again", (SHIM,), MONARCH),
    # -- for Monarch's tests and benchmarks ---------------------------------------------------
    Variable("MONARCH_OPENMPI", "path", "<sys.prefix>/openmpi",
             "the Open MPI (ULFM) prefix of the daemons' MPI: monarch serve --slurm (under PMIx) and the tests' "
             "and benchmarks' daemon launch", (TESTS,)),
    Variable("MONARCH_MPI_ENGINE", "str", None,
             "mpich|ulfm: force the daemons' MPI (monarch serve --slurm: mpich under PMI2; the tests' and "
             "benchmarks' daemon launch)", (TESTS,)),
    Variable("MONARCH_FUZZ_CASES", "int", "600", "cases of the front door's fuzz test", (TESTS,)),
)

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}

TABLE_BEGIN = "<!-- environment: generated from monarch/environment.py by scripts/config_table.py; a test checks it -->"
TABLE_END = "<!-- end environment -->"
HELP_NAME_WIDTH = 25


def variable(name: str) -> Variable:
    """The declaration of ``name`` (KeyError: not declared)."""
    return BY_NAME[name]


def help_text(width: int = 100, readers: tuple[str, ...] | None = None) -> str:
    """The ``environment:`` section of ``monarch run --help`` (every user-facing variable) or of
    another command's (those among them that one of ``readers`` reads): one paragraph (no blank
    line), the doc wrapped under its column."""
    lines = ["environment:"]
    indent = " " * (2 + HELP_NAME_WIDTH)
    for var in VARIABLES:
        if not var.user_facing or (readers is not None and not set(readers) & set(var.readers)):
            continue
        label = f"  {var.name}{var.form}"
        label = label.ljust(2 + HELP_NAME_WIDTH) if len(label) < 2 + HELP_NAME_WIDTH else label + " "
        doc = var.doc + (f" (default {var.default})" if var.default and var.kind in ("ms", "float", "int")
                         and "default" not in var.doc else "")
        wrapped = textwrap.wrap(doc, width - len(indent), break_long_words=False, break_on_hyphens=False) or [""]
        lines.append(label + wrapped[0])
        lines += [indent + rest for rest in wrapped[1:]]
    if readers is None:  # the rest by name: every declared variable is on the page
        by_monarch = [v.name for v in VARIABLES if not v.user_facing and v.set_by == MONARCH]
        others = [v.name for v in VARIABLES if not v.user_facing and v.set_by != MONARCH]
        rest = (f"set by Monarch for CMD's processes, never by hand: {', '.join(by_monarch)}; "
                f"for tests and benchmarks: {', '.join(others)} (docs/configuration.md: Environment)")
        wrapped = textwrap.wrap(rest, width - len(indent), break_long_words=False, break_on_hyphens=False)
        lines.append("  (others)".ljust(2 + HELP_NAME_WIDTH) + wrapped[0])
        lines += [indent + more for more in wrapped[1:]]
    return "\n".join(lines)


def table() -> str:
    """docs/configuration.md's environment table: one row per declared variable."""
    lines = ["| variable | kind | default | read by | set by | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for var in VARIABLES:
        default = f"`{var.default}`" if var.default else "unset"
        lines.append(f"| `{var.name}` | {var.kind} | {default} | {', '.join(var.readers)} | {var.set_by} "
                     f"| {var.doc.replace('|', '&#124;')} |")
    return "\n".join(lines)


def readme_with_table(readme: str) -> str:
    """``readme`` (docs/configuration.md's text) with the text between the table's markers
    replaced by ``table()``."""
    begin, end = readme.index(TABLE_BEGIN) + len(TABLE_BEGIN), readme.index(TABLE_END)
    return readme[:begin] + "\n" + table() + "\n" + readme[end:]

"""The ``monarch`` command: one entry point, subcommands, the user's command after ``--``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import subprocess
import sys

from monarch import __version__, environment
from monarch.errors import EXIT_UNPUBLISHED, EXIT_USAGE, ConfigError, MonarchError

log = logging.getLogger("monarch")

RUN_DESCRIPTION = """\
Run CMD with its reads of the dataset staged by Monarch: the node's daemon (started here
if none runs for this run on this node) copies the files under the dataset roots into the
node-local tiers, from the start and in the background (staging.policy read-ahead, the
default: what fits, pinned; a file CMD waits for first), and CMD's opens read the copies.
When CMD ends, the access report is printed on stderr and written as JSON.

The dataset roots come from, in order: --dataset (given once or more, it replaces
dataset.roots of the configuration, -c or the default); else dataset.roots of -c CONFIG;
else, with the shipped default configuration, the MONARCH_DATASET variable."""

RUN_EPILOG = """\
examples:
  single node, the shipped defaults (either form):
    monarch run --dataset /pfs/datasets/imagenet -- python train.py --data /pfs/datasets/imagenet
    MONARCH_DATASET=/pfs/datasets/imagenet monarch run -- python train.py --data /pfs/datasets/imagenet
  with a configuration file:
    monarch run -c configs/local.yaml -- python train.py
  one monarch run per rank (MPI); the ranks on a node share one daemon:
    mpiexec -n 4 monarch run -c cfg.yaml -- python train.py
  around a launcher that starts the ranks itself:
    monarch run -c cfg.yaml -- torchrun --nproc-per-node 4 train.py

{environment}

exit status:
  CMD's exit code; 128+N if CMD was killed by signal N; 126 if CMD is not executable
  (permission denied, a directory); 127 if CMD is not found; 2 for a Monarch usage or
  configuration error (then CMD is not run); 3 if files CMD wrote under writeback.paths
  could not all be published to the PFS (each is named with where its bytes are kept;
  monarch drain publishes them later). Trouble with the daemon does not stop CMD: it runs
  and reads the PFS directly.

signals:
  SIGINT and SIGTERM are passed on to CMD; a second Ctrl-C kills it. One after CMD ended
  skips the report (exit 128+N, or 137 if CMD was killed); the node daemon still stops."""
RUN_EPILOG = RUN_EPILOG.format(environment=environment.help_text())  # monarch/environment.py: declared once


CHECK_CONFIG_DESCRIPTION = """\
Check CONFIG (every key, every error at once) and the base directories it names on this
node, as monarch run would take it; then show it, sizes as written, and every key with its
value and where the value came from (the file, or the default).

Dataset roots are checked too, unless they come from a variable not set here (the shipped
${MONARCH_DATASET:-}): a job sets it where it runs; they are then shown, not checked.
--dataset PATH replaces them, as with monarch run, and checks them here."""

CHECK_CONFIG_EPILOG = """\
examples:
  monarch check-config configs/local.yaml --dataset /pfs/datasets/imagenet
  MONARCH_DATASET=/pfs/datasets/imagenet monarch check-config configs/cluster.yaml
  monarch check-config                     (the shipped defaults)

exit status:
  0 if the configuration is fine here; 2 for any configuration error (a wrong key or value,
  a base directory this node cannot use, a dataset root that is not there), as monarch run."""

DRAIN_DESCRIPTION = """\
Publish what a killed daemon or a rebooted node left of a job's write-back on this node: each
of your write-back areas in the write-back tier's base (writeback.tier of CONFIG, else its
first tier) whose run is gone is drained as its daemon would have drained it, in the job's
order, each file whole under its name; then the area is removed. An area whose run is still
alive is left to it, and nothing that is not on the PFS is deleted."""

DRAIN_EPILOG = """\
examples:
  monarch drain -c configs/cluster.yaml      on the node, after a job whose daemon was killed
  on every node of a Slurm allocation at once, in the job's order across the nodes (the batch
  script's last line, docs/cluster.md "Under Slurm"):
    monarch drain --slurm -c job.yaml
  the same outside Slurm, one rank a node:  mpiexec -n NODES monarch drain -c job.yaml

exit status:
  0 if every area was drained completely, or there was none; 3 if a file could not be
  published (each is named with where its bytes are kept: run monarch drain again once the
  PFS takes it); 2 for a usage or configuration error."""


def _mpi_world_rank():
    from monarch.cluster.world import mpi_world_rank
    return mpi_world_rank()


def _setup_logging(verbose: int, node: str) -> None:
    from monarch.launch import logs
    logs.setup(verbose, node)


def _load(path: str | None, **kw):
    from monarch.config import load_config
    return load_config(path, **kw)


def find_command(name: str, path: str | None = None) -> tuple[int, str] | None:
    """Can ``name`` be executed, as a shell would find it? None if so, else (exit code, reason).

    A name with a '/' is taken as a path; any other is looked up in ``path`` (default: $PATH),
    an empty entry meaning the current directory. 127: not found; 126: found but not executable.
    """
    if "/" in name:
        candidates = [name]
    else:
        path = os.environ.get("PATH", os.defpath) if path is None else path
        candidates = [os.path.join(d or ".", name) for d in path.split(os.pathsep)]
    denied = None
    for candidate in candidates:
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            denied = denied or "Is a directory"
        elif not os.access(candidate, os.X_OK):
            denied = "Permission denied"
        else:
            return None
    if denied:
        return 126, denied
    return 127, "No such file or directory" if "/" in name else "command not found"


def cmd_run(args) -> int:
    from monarch.launch.run import run
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        raise MonarchError("monarch run: no command given; usage: monarch run [-c CONFIG] -- CMD ARGS...")
    from monarch import topology
    # the outermost run of an unnamed job names it; its configuration sees the name
    run_name = topology.run_id() or topology.new_run_id()
    config = _load(args.config, roots=args.dataset, env=dict(os.environ, **{topology.ENV_RUN_ID: run_name}))
    _check_html_report(args.report_html, config)
    if config.dataset.stores:  # no PFS behind a store's root: an unreachable store stops the job here
        from monarch.store.check import check_stores
        notes: list[str] = []
        for line in check_stores(config.dataset.store_roots(), notes=notes):
            print(f"monarch: store: {line}" + ("; going on (--fail-open)" if args.fail_open else
                                                "; exit 2 (--fail-open runs the command anyway)"), file=sys.stderr)
            if not args.fail_open:
                return EXIT_USAGE
        for line in notes:  # keys a bucket holds that no file can have: one line each store, at start
            print(f"monarch: store: {line}", file=sys.stderr)
    problem = find_command(cmd[0])
    if problem is not None:  # as a shell or srun would say it, before any daemon starts
        code, reason = problem
        print(f"monarch: {cmd[0]}: {reason}", file=sys.stderr)
        return code
    from monarch.launch.progress import wanted
    log.debug("phase launcher.ready")
    return run(config, cmd, args.report, run_name, progress=wanted(args.no_progress),
               html_path=args.report_html)


def _check_html_report(option: str | None, config) -> None:
    """An HTML report asked for (--report-html, or report_html) needs matplotlib: say so before
    the command runs, not after the job ended."""
    if option or config.report_html:
        from monarch.report.html import require_matplotlib
        require_matplotlib("--report-html" if option else f"config {config.source}: report_html")


def cmd_serve(args) -> int:
    cluster = None
    if not args.embedded:  # a stop asked while it starts is kept for when it serves (not its death)
        from monarch.launch.service import catch_stop_signals
        catch_stop_signals()
    in_mpi = not args.embedded and _mpi_world_rank() is not None
    if not args.embedded and (args.slurm or (not in_mpi and _slurm_allocation())):
        return _serve_slurm(args)  # the batch script or salloc's shell: the daemons' step is built here
    # the peer layer is imported only by a standing daemon under MPI (not on the launch path).
    # MPI_Init first, before the daemon's imports: it spins a core until every rank has
    # reached it, so ranks that arrive early would burn the CPU the late ones need to get there
    if in_mpi:
        from monarch.launch import slurm
        by_srun = slurm.launched_by_srun()
        config_for_note = lambda: _load(args.config, roots=args.dataset, check_roots=False)  # noqa: E731
        if by_srun:  # a wrong srun line is said at once, before MPI_Init hangs or aborts on it
            slurm.refuse_wrong_launch(config_for_note)
        from monarch.cluster.world import abort_on_unhandled_exception
        abort_on_unhandled_exception()  # initialises MPI; one failing rank must not hang the others
        if by_srun:
            slurm.refuse_world_of_one(config_for_note)
        rank = _mpi_world_rank()  # MPI's own answer now
        os.environ["MONARCH_NODE"] = str(rank)  # each node expands ${MONARCH_NODE} to its own dirs
        _setup_logging(args.verbose, str(rank))
    from monarch.launch import service
    from monarch.topology import job_id, run_id
    service.import_daemon()
    # embedded: the configuration its launcher loaded and checked; standing: its own file
    config = service.received_config() if args.embedded else _load(args.config, roots=args.dataset)
    if in_mpi:
        slurm.clear_refusal(config)  # a wrong start's note for the launchers, from before this one
        from monarch.cluster import Cluster
        cluster = Cluster.from_world(peer_timeout=config.peer.timeout)
    # embedded: the run its launcher named; standing: the job, which the job's launchers look for
    rid = run_id() if args.embedded else job_id()
    if not rid:
        raise MonarchError("monarch serve --embedded is started by monarch run, with MONARCH_RUN_ID set")
    try:
        return service.serve(config, rid, cluster, args.embedded, args.report)
    except BaseException:
        # (a bad tier path, say): the peer threads stop before MPI is finalised at exit, which
        # they would otherwise crash with a signal or an MPI abort that hides the error itself
        if cluster is not None:
            cluster.close()
        raise


def _slurm_allocation() -> bool:
    from monarch.launch.slurm import wants_step
    return wants_step()


def _serve_slurm(args) -> int:
    """``monarch serve`` in a Slurm allocation: one daemon per node in a step of their own
    (monarch/launch/slurm.py), stopped cleanly by a SIGTERM."""
    from monarch.launch import slurm
    serve_args = (["-c", args.config] if args.config else []) + \
        [a for root in args.dataset or [] for a in ("--dataset", root)] + (["--report", args.report] if args.report else [])
    step = slurm.daemon_step(serve_args, verbose=args.verbose)
    print(f"monarch: the daemons' step ({step.engine} under --mpi={step.mpi}): {' '.join(step.argv)}",
          file=sys.stderr, flush=True)
    from monarch.launch.service import catch_stop_signals
    return slurm.serve_step(step, catch_stop_signals())  # the same list: a signal since the start counts


def cmd_stop(args) -> int:
    from monarch.launch import service
    config = _load(args.config, check_roots=False)  # stopping needs no dataset (it may be gone already)
    service.stop(config)
    return 0


def cmd_drain(args) -> int:
    if args.slurm:
        return _drain_slurm(args)  # the batch script: a step of one drain a node, all at once
    from monarch.launch.drained import NOTHING_LEFT, say_drained
    from monarch.writeback.across import drain_in_order
    from monarch.writeback.orphans import find_left, finished
    exchange = None
    if _mpi_world_rank() is not None:  # one rank a node (srun, mpiexec): the nodes drain in the job's order together
        from monarch.cluster.world import abort_on_unhandled_exception
        abort_on_unhandled_exception()  # initialises MPI; one failing rank must not hang the others
        from monarch.cluster.drains import MpiExchange
        exchange = MpiExchange()
        os.environ["MONARCH_NODE"] = str(exchange.rank)  # each node expands ${MONARCH_NODE} to its own tier
    config = _load(args.config, check_roots=False)  # draining needs no dataset, nor the paths it writes back
    tier = config.writeback_tier()
    live, areas = find_left(tier.path)  # each of areas held now: no live owner, no other drain
    for path in live:
        print(f"{path}: held by its run, still alive: left to it")
    if not areas:
        print(f"nothing to drain in tier {tier.name} ({tier.path}): {NOTHING_LEFT}")
    complete = [say_drained(d) for d in drain_in_order(areas, exchange, finished(tier.path))]
    if exchange is not None:  # every node's lines said before any exits (srun ends the others at a drain's exit 3)
        sys.stdout.flush()
        exchange.close()
    return 0 if all(complete) else EXIT_UNPUBLISHED


def _drain_slurm(args) -> int:
    """``monarch drain`` in a Slurm allocation: one drain per node in a step of their own, under the
    MPI the daemons use (monarch/launch/slurm.py), so that they publish in the job's order together."""
    from monarch.launch import slurm
    step = slurm.daemon_step(["-c", args.config] if args.config else [], verbose=args.verbose, command="drain")
    print(f"monarch: the drains' step ({step.engine} under --mpi={step.mpi}): {' '.join(step.argv)}",
          file=sys.stderr, flush=True)
    return subprocess.run(step.argv, env={**os.environ, **step.env}).returncode


def cmd_index(args) -> int:
    from monarch.node.snapshot import index_command
    return index_command.run(args.roots, args.output, sizes=args.sizes, list_path=args.from_list)


def cmd_check_config(args) -> int:
    from monarch.config.check import check_config
    for line in check_config(args.file, args.dataset):
        print(line)
    return 0


def _files_per_second(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        rate = float(text.removesuffix("/s"))
    except ValueError:
        rate = 0.0
    if rate <= 0:
        raise ConfigError(f"monarch plan: --file-rate: expected files per second like 3000, got {text!r}")
    return rate


def cmd_plan(args) -> int:
    from monarch import plan
    from monarch.config import parse_size
    if (args.files is None) != (args.file_size is None):
        raise MonarchError("monarch plan: give --files N and --file-size SIZE together (a synthetic dataset), "
                           "or --dataset PATH, or neither (the configuration's dataset.roots)")
    synthetic = args.files is not None
    if synthetic and args.dataset:
        raise MonarchError("monarch plan: give either --dataset PATH or --files N --file-size SIZE, not both")
    # a synthetic dataset needs no roots: any path stands in for them, unchecked
    config = _load(args.config, roots=[os.sep + "monarch-plan-synthetic"] if synthetic else args.dataset,
                   check_roots=not synthetic)
    if synthetic:
        try:
            size = parse_size(args.file_size)
        except ValueError:
            raise MonarchError(f'monarch plan: --file-size: expected a size like "110KiB", got {args.file_size!r}') \
                from None
        if args.files < 0:
            raise MonarchError(f"monarch plan: --files must be at least 0, got {args.files}")
        items = plan.synthetic(args.files, size)
    else:
        from monarch.node.snapshot.snapshot import take_snapshot
        snap = take_snapshot(config.dataset.roots)
        items = ((key, info.size) for key, info in snap.files.items())
    nodes = args.nodes if args.nodes is not None else int(os.environ.get("SLURM_JOB_NUM_NODES")
                                                            or os.environ.get("SLURM_NNODES") or 1)
    result = plan.make_plan(items, nodes, plan.node_storage(config),
                            replicas=args.replicas if args.replicas is not None else config.peer.replicas,
                            pfs_rate=plan.parse_rate(args.pfs_rate) if args.pfs_rate else None, shard=args.shard,
                            file_rate=_files_per_second(args.file_rate))
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print(plan.format_plan(result))
    return 0


def cmd_report(args) -> int:
    from monarch.report.store import load_report
    from monarch.report.text import print_report
    report = load_report(args.file)
    if args.html:
        from monarch.report.html import write_html
        write_html(report, args.html)
        print(f"{args.html}: written (open it in a browser; it needs no network)")
        return 0
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_report(report, sys.stdout)
    return 0


def cmd_store(args) -> int:
    from monarch.store.load import ls, put
    from monarch.store.client import parse_url
    url = parse_url(args.url)
    if args.store_verb == "put":
        manifest, loaded = put(args.directory, url, jobs=args.jobs, out=None if args.no_progress else sys.stderr)
        print(f"store put: {len(manifest.files)} files, {manifest.total_bytes} bytes in {url} ({loaded} loaded now, "
              f"{len(manifest.files) - loaded} by an earlier put); manifest {manifest.version or 'written'}")
    else:
        ls(url, long=args.long)
    return 0


def cmd_cache(args) -> int:
    from monarch.launch import cache
    places = cache.bases(_load(args.config, check_roots=False), args.base)
    if args.cache_verb == "ls":
        return cache.ls(places, sys.stdout)
    return cache.drop(places, args.paths, args.expired, sys.stdout)


def cmd_demo(args) -> int:
    from monarch.tools.demo import demo
    return demo(args.dir, files=args.files, epochs=args.epochs, workers=args.workers,
                open_latency_ms=args.pfs_open_ms)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="monarch", description="Hierarchical data staging for DL training on HPC.",
                                epilog="'monarch COMMAND --help' says more about each command.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="say more on stderr (-vv: debug)")
    p.add_argument("--version", action="version", version=f"monarch {__version__}")
    sub = p.add_subparsers(dest="sub", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run a command with its dataset reads staged by Monarch",
                       usage="monarch run [-h] [-c CONFIG] [--dataset PATH] [--report PATH] [--report-html PATH] "
                             "[--no-progress] [--fail-open] -- CMD [ARGS...]",
                       description=RUN_DESCRIPTION, epilog=RUN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("-c", "--config", help="YAML configuration (default: the shipped single-node defaults, "
                                          "as in configs/local.yaml)")
    r.add_argument("--dataset", action="append", metavar="PATH",
                   help="a dataset root (repeat for several); replaces dataset.roots of the configuration")
    r.add_argument("--report", metavar="PATH",
                   help="where to write the JSON report (default: the configuration's report)")
    r.add_argument("--report-html", metavar="PATH",
                   help="also write the report as one self-contained HTML page with plots (needs matplotlib)")
    r.add_argument("--no-progress", action="store_true",
                   help="no live progress on stderr while CMD runs (or MONARCH_PROGRESS=0)")
    r.add_argument("--fail-open", action="store_true",
                   help="run CMD even when a store of dataset.stores cannot be reached at the start (default: exit 2)")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the command to run")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("serve", help="run the node daemon (one per node; under mpiexec, a cluster)",
                       epilog=environment.help_text(readers=(environment.DAEMON, environment.CONFIG)),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("-c", "--config")
    s.add_argument("--dataset", action="append", metavar="PATH",
                   help="a dataset root (repeat for several); replaces dataset.roots of the configuration")
    s.add_argument("--report", help="where the job report goes at stop (default: the run directory's report.json)")
    s.add_argument("--slurm", action="store_true",
                   help="in a Slurm allocation (the default in one of several nodes, outside a step): start one daemon per node in "
                        "a step of their own (srun --overlap, the PMI of the daemons' MPI); SIGTERM stops them "
                        "cleanly and node 0 writes the report")
    s.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_serve)

    st = sub.add_parser("stop", help="stop this node's daemon")
    st.add_argument("-c", "--config")
    st.set_defaults(func=cmd_stop)

    dr = sub.add_parser("drain", help="publish the write-back a killed daemon or a rebooted node left on this node",
                        description=DRAIN_DESCRIPTION, epilog=DRAIN_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    dr.add_argument("-c", "--config",
                    help="the configuration whose write-back tier to look in (default: the shipped one)")
    dr.add_argument("--slurm", action="store_true",
                    help="from a batch script: one drain on every node of the allocation, together, in the job's order")
    dr.set_defaults(func=cmd_drain)

    ix = sub.add_parser("index", help="write a dataset's namespace once, for dataset.manifest",
                        description="List the dataset's roots once (in parallel, as find does) and write their "
                                    "namespace to FILE: jobs given it as dataset.manifest read their snapshot from it "
                                    "instead of walking the PFS, after one stat per directory.")
    ix.add_argument("roots", nargs="+", metavar="ROOT", help="the dataset's roots, in dataset.roots's order")
    ix.add_argument("-o", "--output", required=True, metavar="FILE", help="the manifest to write")
    ix.add_argument("--sizes", action="store_true", help="stat every file too (one PFS call each): sizes to plan by")
    ix.add_argument("--from-list", metavar="LIST",
                    help="the files from a list of yours, not a walk: a path a line (relative to ROOT, or "
                         "absolute), a TAB and its size optional, as find ROOT -type f -printf '%%P\\t%%s\\n' writes")
    ix.set_defaults(func=cmd_index)

    c = sub.add_parser("check-config", help="validate a configuration, on this node, as monarch run would take it",
                       usage="monarch check-config [-h] [CONFIG] [--dataset PATH]",
                       description=CHECK_CONFIG_DESCRIPTION, epilog=CHECK_CONFIG_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", nargs="?", metavar="CONFIG",
                   help="YAML configuration (default: the shipped defaults, as in configs/local.yaml)")
    c.add_argument("--dataset", action="append", metavar="PATH",
                   help="a dataset root (repeat for several); replaces dataset.roots, as with monarch run, "
                        "and is checked here")
    c.set_defaults(func=cmd_check_config)

    pl = sub.add_parser("plan", help="what each node of a cluster will hold of the dataset, and the traffic",
                        description="Plan a cluster: per node and tier what it holds of the dataset, what stays "
                                    "on the PFS, the traffic of an epoch of sharded reads, the staging time and "
                                    "the placement's balance (docs/cluster.md, 'Capacity model and placement').")
    pl.add_argument("-c", "--config", help="YAML configuration: each node's tiers and peer area (default: the shipped one)")
    pl.add_argument("--nodes", type=int, metavar="N", help="nodes (default: SLURM_JOB_NUM_NODES, else 1)")
    pl.add_argument("--dataset", action="append", metavar="PATH",
                    help="walk this dataset root (repeat for several; default: the configuration's roots)")
    pl.add_argument("--files", type=int, metavar="N", help="a synthetic dataset of N files...")
    pl.add_argument("--file-size", metavar="SIZE", help="...of SIZE each (110KiB)")
    pl.add_argument("--pfs-rate", metavar="RATE", help="the PFS's aggregate read rate (10GiB/s), for the staging time")
    pl.add_argument("--file-rate", metavar="FILES/S", help="files per second one node's stager copies (default "
                    "3000, measured on small files; the report's staging figures give yours)")
    pl.add_argument("--replicas", type=int, choices=(1, 2), help="copies of each file (default: peer.replicas)")
    pl.add_argument("--shard", action="store_true", help="shard even when every node could hold the whole dataset")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.set_defaults(func=cmd_plan)

    rep = sub.add_parser("report", help="print a JSON report again")
    rep.add_argument("file")
    rep.add_argument("--json", action="store_true", help="print the JSON itself")
    rep.add_argument("--html", metavar="OUT", help="write it as one self-contained HTML page with plots "
                                                   "(needs matplotlib)")
    rep.set_defaults(func=cmd_report)

    so = sub.add_parser("store", help="load a directory into a key-value store, or list what a store holds")
    sov = so.add_subparsers(dest="store_verb", required=True, metavar="VERB")
    sp = sov.add_parser("put", help="load DIR into the store at URL (parallel, resumable; the manifest last)")
    sp.add_argument("directory", metavar="DIR")
    sp.add_argument("url", metavar="URL", help="redis://host:port/db?prefix=P, rediss://..., unix:///path.sock?...")
    sp.add_argument("-j", "--jobs", type=int, default=16, help="files loaded at once (default 16)")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sp.set_defaults(func=cmd_store)
    sl = sov.add_parser("ls", help="list the files of the dataset in the store at URL")
    sl.add_argument("url", metavar="URL")
    sl.add_argument("-l", "--long", action="store_true", help="size and digest of each file too")
    sl.set_defaults(func=cmd_store)

    ca = sub.add_parser("cache", help="list or free your shared and kept copies on this node (docs/sharing.md)")
    cav = ca.add_subparsers(dest="cache_verb", required=True, metavar="VERB")
    for verb, text in (("ls", "list your shared copy sets and kept tiers in the tier bases"),
                       ("drop", "remove your shared copy sets and kept tiers no running job uses")):
        v = cav.add_parser(verb, help=text)
        v.add_argument("-c", "--config", help="the configuration whose tier bases to look in (default: the shipped one)")
        v.add_argument("--base", action="append", metavar="DIR", help="another tier base to look in (repeat)")
        if verb == "drop":
            v.add_argument("paths", nargs="*", metavar="PATH", help="only these sets (as `monarch cache ls` shows)")
            v.add_argument("--expired", action="store_true",
                           help="only shared sets whose linger is over (the line a Slurm epilog runs)")
        v.set_defaults(func=cmd_cache)

    from monarch.tools.demo import OPEN_LATENCY_MS
    d = sub.add_parser("demo", help="make a demo dataset behind an emulated slow PFS and read it for several "
                                    "epochs, directly and under monarch run")
    d.add_argument("--dir", default=None, help="where to put the demo dataset (default: a temporary directory)")
    d.add_argument("--files", type=int, default=2000)
    d.add_argument("--epochs", type=int, default=3)
    d.add_argument("--workers", type=int, default=4)
    d.add_argument("--pfs-open-ms", type=float, default=OPEN_LATENCY_MS, metavar="MS",
                   help=f"what an open of the emulated slow PFS costs (FUSE; default {OPEN_LATENCY_MS:g}; "
                        "0: no emulated PFS, the dataset read from the local disk)")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """``monarch ...``: a usage or configuration error exits 2 (``MonarchError``, argparse);
    a reader of standard output that went away (``| head``) ends it quietly."""
    try:
        try:
            return _main(argv)
        finally:  # here, not at exit (--help's SystemExit too): a reader gone is found while it can be handled
            sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        return _quiet_stdout()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # `monarch` alone: the help, as a usage error
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        from monarch.topology import node_index
        _setup_logging(args.verbose, str(node_index()))
    try:
        return args.func(args)
    except MonarchError as e:
        print(f"monarch: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_reader_gone() -> bool:
    """Is standard output a pipe whose reader has closed it (``monarch report | head``)?"""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_stdout() -> int:
    """The reader of standard output went away (``| head -1``): it had what it wanted, so
    say nothing and exit 0 (as ripgrep does; under ``set -o pipefail`` the pipeline stays
    true). What is left in Python's buffer goes to /dev/null, so the interpreter's flush at
    exit prints no traceback (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0

"""``monarch check-config``: a configuration checked on this node as ``monarch run`` would take
it, and shown for people (sizes as written, every key with where its value came from).

Every problem is a ``ConfigError`` (the command exits 2, as ``monarch run`` does for it): a key
that is wrong, a base directory this node cannot use, a dataset root that is not there. One
thing is left to the run: dataset roots that come from an environment variable unset here
(the shipped ``${MONARCH_DATASET:-}``): a job sets it, or gives ``--dataset``, where it runs;
they are shown, not checked (``--dataset PATH`` checks a root here).
"""

from __future__ import annotations

import os
import re
import socket
from typing import Mapping, Sequence

from monarch.config.docs import listing, size_text
from monarch.config.keys import ENV_WRITEBACK, default_tree
from monarch.config.load import DEFAULTS_SOURCE, base_problems, builtin_env, combine_errors, load_config, read_user
from monarch.config.model import Config
from monarch.errors import ConfigError
from monarch.sizes import human

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")

__all__ = ["check_config", "size_for_people", "unset_variables_of_roots"]


def size_for_people(n: int) -> str:
    """``4GiB`` when exact (as a configuration writes it), else ``1.5 GiB (1610612737 bytes)``."""
    exact = size_text(n)
    if not exact.isdigit():
        return exact
    return f"{n} B" if n < 1024 else f"{human(n)} ({n} bytes)"


def unset_variables_of_roots(path: str | os.PathLike | None, env: Mapping[str, str]) -> list[str]:
    """The environment variables the dataset roots (of ``path``, else the shipped defaults) name
    that are not set in ``env``: the roots are then the job's to give, where it runs."""
    roots = default_tree()["dataset"]["roots"]
    if path is not None:
        dataset = read_user(path).get("dataset")
        if isinstance(dataset, dict) and "roots" in dataset:
            roots = dataset["roots"]
    texts = [roots] if isinstance(roots, str) else roots if isinstance(roots, list) else []
    names = [name for text in texts if isinstance(text, str) for name in _VARIABLE.findall(text)]
    return sorted({name for name in names if name not in env})


def check_config(path: str | None, roots: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> list[str]:
    """The lines ``monarch check-config`` prints for ``path`` (None: the shipped defaults),
    ``roots`` replacing its dataset roots (``--dataset``); raises ConfigError on any problem."""
    env = builtin_env(env)
    waiting = [] if roots else unset_variables_of_roots(path, env)
    config = load_config(path, env, roots=roots or None, check_roots=not waiting)
    problems = base_problems(config)  # a base that would not be used: the file is not OK here
    if problems:
        raise ConfigError(combine_errors(config.source, problems) + "\n"
                          f"(base directories are checked on this node, {socket.gethostname()}; "
                          "a node-local one must exist on every node of the job)")
    lines = [f"{path if path is not None else DEFAULTS_SOURCE}: OK"]
    lines.append(f"  roots   : {_roots_text(config, waiting)}")
    if config.dataset.stores:  # a store's root: its store answers and holds a manifest, here and now
        from monarch.store.check import check_stores
        found: list = []
        problems = check_stores(config.dataset.store_roots(), found)
        if problems:
            raise ConfigError(combine_errors(config.source, [f"dataset.stores: {p}" for p in problems]))
        for root, url, manifest in found:
            lines.append(f"  store   : {root} <- {url}: {len(manifest.files)} files, "
                         f"{size_for_people(manifest.total_bytes)}, "
                         f"{'listing' if url.scheme == 's3' else 'manifest'} {manifest.version[:12]}")
    for t in config.tiers:
        capacity = f"{t.capacity_share:.0%} of the node" if t.capacity_share is not None else size_for_people(t.capacity)
        lines.append(f"  tier    : {t.name} {t.path} capacity {capacity}{' (kept)' if t.keep else ''}")
    margin = (f"{config.memory_margin_share:.0%} of the node's memory" if config.memory_margin_share is not None
              else size_for_people(config.memory_margin))
    lines.append(f"  memory  : RAM tiers leave {margin} available")
    reserve = (f"{config.filesystem_reserve_share:.0%}" if config.filesystem_reserve_share is not None
               else size_for_people(config.filesystem_reserve) if config.filesystem_reserve else None)
    lines.append(f"  reserve : each tier leaves {reserve} of its filesystem free for the application" if reserve
                 else "  reserve : none (filesystem_reserve: 0): tiers may fill their filesystems")
    lines.append(f"  staging : {config.staging.policy}, {config.staging.threads or 'auto'} copies in flight, "
                 f"validate {config.staging.validate}")
    lines.append(f"  run_base: {config.run_base}")
    lines.append(f"  writeback: {_writeback_text(config, env)}")
    lines += _keys(config, path, env)
    return lines


def _writeback_text(config: Config, env: Mapping[str, str]) -> str:
    wb = config.writeback
    if not wb.enabled:
        return f"off ({ENV_WRITEBACK} is empty)" if ENV_WRITEBACK in env else \
            f"off (writeback.paths is empty and {ENV_WRITEBACK} unset)"
    tier = config.writeback_tier()
    room = f"{wb.room_share:.0%} of its capacity" if wb.room_share is not None else size_for_people(wb.room)
    given = f" (from {ENV_WRITEBACK})" if ENV_WRITEBACK in env else ""
    return f"{', '.join(wb.paths)}{given} via tier {tier.name} {tier.path}, room {room}, fsync {wb.fsync}"


def _roots_text(config: Config, waiting: list[str]) -> str:
    if not waiting:
        return ", ".join(config.dataset.given)
    names = " and ".join(waiting)
    verb = "is" if len(waiting) == 1 else "are"
    if config.dataset.given:
        return (f"{', '.join(config.dataset.given)} (the file's default for {names}, which {verb} not set here; "
                f"not checked: where the job runs, {names} or --dataset PATH decides)")
    return (f"none yet: {names} {verb} not set here; monarch run needs {names} or --dataset PATH "
            "(check-config --dataset PATH checks a root here)")


def _keys(config: Config, path: str | None, env: Mapping[str, str]) -> list[str]:
    """Every declared key with its value and where it came from (the file, the environment, or the default)."""
    user = read_user(path) if path is not None else {}
    rows = listing(config, user, str(path) if path is not None else "default")
    if ENV_WRITEBACK in env:  # it replaces the file's paths (load_config)
        rows = [(key, value, ENV_WRITEBACK if key == "writeback.paths" else origin) for key, value, origin in rows]
    width = max(len(key) for key, _, _ in rows)
    return ["every key (value, from):"] + [f"  {key:<{width}}  {value}  ({origin})" for key, value, origin in rows]


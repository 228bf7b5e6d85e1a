"""YAML configuration: load, expand ``${VAR}``, validate up front, freeze.

The shipped defaults (``monarch/defaults.yaml``) and the dataclasses below are the schema;
``tests/unit/test_config.py`` keeps them and ``configs/local.yaml`` in sync.
Every error names the file, the key and the fix.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from monarch.errors import ConfigError
from monarch.protocol import MAX_TIERS

DEFAULTS_FILE = Path(__file__).with_name("defaults.yaml")
POLICIES = ("read-ahead", "on-access", "prestage", "off")
VALIDATE_MODES = ("none", "open")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class TierConfig:
    name: str
    path: str
    capacity: int  # bytes
    keep: bool = False  # keep staged files after the job (reused by the next job)


@dataclass(frozen=True)
class DatasetConfig:
    roots: tuple[str, ...]  # canonical: symlinks resolved
    given: tuple[str, ...] = ()  # as configured (absolute), e.g. /scratch/ds when /scratch -> /lustre/scratch

    def spellings(self) -> list[tuple[int, str]]:
        """(root index, path) for every spelling of every root that the shim should match."""
        out = [(k, root) for k, root in enumerate(self.roots)]
        out += [(k, given) for k, given in enumerate(self.given) if given != self.roots[k]]
        return out


@dataclass(frozen=True)
class StagingConfig:
    policy: str = "read-ahead"
    threads: int = 0  # copies in flight toward the sources; 0 ("auto"): adapted to what they give
    resolve_timeout: float = 30.0  # seconds a shim request waits for staging before "read the PFS"
    validate: str = "none"  # "open": compare size and mtime with the PFS at each file's first open in a job


@dataclass(frozen=True)
class PeerConfig:
    path: str
    capacity: int
    timeout: float = 10.0


@dataclass(frozen=True)
class Config:
    source: str  # where it came from, for messages
    dataset: DatasetConfig
    run_dir: str
    tiers: tuple[TierConfig, ...]
    staging: StagingConfig
    peer: PeerConfig
    report: str | None = None  # JSON report path; default: the run's directory (monarch/layout.py)


def parse_size(text: Any) -> int:
    """``"64GiB"`` -> bytes; raises ValueError with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError
    if isinstance(text, int) and text >= 0:
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}``; an unset variable without default is an error."""
    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise KeyError(name)
            return default
        return value
    return _VAR_RE.sub(sub, text)


def builtin_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for expansion, with the variables Monarch itself provides."""
    from monarch.topology import job_id, node_index, user_name
    out = dict(os.environ if env is None else env)
    out.setdefault("MONARCH_NODE", str(node_index(out)))
    out.setdefault("MONARCH_JOB_ID", job_id(out))
    out.setdefault("USER", user_name())
    return out


def load_config(path: str | os.PathLike | None, env: Mapping[str, str] | None = None) -> Config:
    """Load ``path`` over the shipped defaults (``None``: the defaults alone)."""
    env = builtin_env(env)
    raw = _read_yaml(DEFAULTS_FILE, str(DEFAULTS_FILE))
    source = str(DEFAULTS_FILE)
    if path is not None:
        source = str(path)
        user = _read_yaml(Path(path), source)
        _check_keys(user, raw, source, "")
        raw = _merge(raw, user)
    return _validate(raw, source, env)


def _read_yaml(path: Path, source: str) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"config {source}: cannot read it: {e.strerror}; check the path given with -c") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config {source}:{where}: not valid YAML ({getattr(e, 'problem', e)}); "
                          "fix the syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {source}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data


def _check_keys(user: Any, defaults: Any, source: str, where: str) -> None:
    """Unknown keys are typos: say which and list the known ones."""
    if not isinstance(user, dict) or not isinstance(defaults, dict):
        return
    for key, value in user.items():
        here = f"{where}.{key}" if where else str(key)
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            raise ConfigError(f"config {source}: {here}: unknown key; known keys here: {known}")
        _check_keys(value, defaults[key], source, here)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class _Reader:
    """Typed access to the raw mapping that turns every problem into a ConfigError."""

    def __init__(self, source: str, env: Mapping[str, str]):
        self.source, self.env = source, env

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"config {self.source}: {key}: {problem}")

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.fail(key, f"expected a string, got {value!r}")
        try:
            return expand_vars(str(value), self.env)
        except KeyError as e:
            raise self.fail(key, f"${{{e.args[0]}}} is not set; set it in the environment "
                                 f"or give a default as ${{{e.args[0]}:-value}}") from None

    def path(self, value: Any, key: str) -> str:
        text = self.string(value, key)
        if not text:
            raise self.fail(key, "expected a path, got an empty string")
        if ":" in text:
            raise self.fail(key, f"paths may not contain ':' (it separates paths for the shim), got {text!r}")
        return os.path.abspath(os.path.expanduser(text))

    def size(self, value: Any, key: str) -> int:
        try:
            return parse_size(self.string(value, key) if isinstance(value, str) else value)
        except ValueError:
            raise self.fail(key, f'expected a size like "64GiB" (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), '
                                 f"got {value!r}") from None

    def number(self, value: Any, key: str, kind: type, minimum: float) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise self.fail(key, f"expected {'a whole number' if kind is int else 'a number'}, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value!r}")
        return kind(value)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def mapping(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping of keys, got {value!r}")
        return value


def _validate(raw: dict, source: str, env: Mapping[str, str]) -> Config:
    r = _Reader(source, env)
    dataset = r.mapping(raw.get("dataset"), "dataset")
    roots = dataset.get("roots")
    if roots is None or roots == []:
        raise r.fail("dataset.roots", "no dataset roots: list the directories Monarch manages, "
                                      "or set MONARCH_DATASET for the default configuration")
    if isinstance(roots, str):
        roots = [roots]
    if not isinstance(roots, list):
        raise r.fail("dataset.roots", f"expected a list of directories, got {roots!r}")
    roots = [r.string(v, f"dataset.roots[{i}]") for i, v in enumerate(roots)]
    if not any(roots):
        raise r.fail("dataset.roots", "no dataset roots: list the directories Monarch manages, "
                                      "or set MONARCH_DATASET for the default configuration")
    given = tuple(r.path(v, f"dataset.roots[{i}]") for i, v in enumerate(roots))
    root_paths = tuple(os.path.realpath(g) for g in given)

    tiers_raw = raw.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise r.fail("tiers", "expected a list of tiers, fastest first (name, path, capacity)")
    if len(tiers_raw) > MAX_TIERS:
        raise r.fail("tiers", f"at most {MAX_TIERS} tiers, got {len(tiers_raw)}")
    tiers = []
    for i, t in enumerate(tiers_raw):
        key = f"tiers[{i}]"
        t = r.mapping(t, key)
        unknown = set(t) - {f.name for f in fields(TierConfig)}
        if unknown:
            raise r.fail(f"{key}.{sorted(unknown)[0]}", "unknown key; known keys here: capacity, keep, name, path")
        for required in ("name", "path", "capacity"):
            if required not in t:
                raise r.fail(f"{key}.{required}", "missing; every tier needs name, path and capacity")
        tiers.append(TierConfig(name=r.string(t["name"], f"{key}.name"), path=r.path(t["path"], f"{key}.path"),
                                capacity=r.size(t["capacity"], f"{key}.capacity"),
                                keep=r.boolean(t.get("keep", False), f"{key}.keep")))
    names = [t.name for t in tiers]
    for i, name in enumerate(names):
        if name in ("pfs", "peer") or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise r.fail(f"tiers[{i}].name", f"{name!r} is not allowed: use letters, digits, '-' or '_', "
                                             "and not 'pfs' or 'peer' (report sources)")
        if name in names[:i]:
            raise r.fail(f"tiers[{i}].name", f"{name!r} is used by another tier; tier names must differ")
    paths = [t.path for t in tiers]
    for i, p in enumerate(paths):
        for root in root_paths:
            if p == root or p.startswith(root + os.sep) or root.startswith(p + os.sep):
                raise r.fail(f"tiers[{i}].path", f"{p} overlaps the dataset root {root}; put tiers elsewhere")

    staging = r.mapping(raw.get("staging"), "staging")
    policy = r.string(staging.get("policy"), "staging.policy")
    if policy not in POLICIES:
        raise r.fail("staging.policy", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
    validate = r.string(staging.get("validate", "none"), "staging.validate")
    if validate not in VALIDATE_MODES:
        raise r.fail("staging.validate", f"expected one of {', '.join(VALIDATE_MODES)}, got {validate!r}")
    threads = staging.get("threads")
    if isinstance(threads, str) and threads != "auto":
        raise r.fail("staging.threads", f'expected "auto" or a whole number of copies in flight, got {threads!r}')
    threads = 0 if threads == "auto" else r.number(threads, "staging.threads", int, 1)
    staging_cfg = StagingConfig(policy=policy, threads=threads,
                                resolve_timeout=r.number(staging.get("resolve_timeout"), "staging.resolve_timeout",
                                                         float, 0.1), validate=validate)
    peer = r.mapping(raw.get("peer"), "peer")
    peer_cfg = PeerConfig(path=r.path(peer.get("path"), "peer.path"),
                          capacity=r.size(peer.get("capacity"), "peer.capacity"),
                          timeout=r.number(peer.get("timeout"), "peer.timeout", float, 0.1))
    report = raw.get("report")
    return Config(source=source, dataset=DatasetConfig(roots=root_paths, given=given),
                  run_dir=r.path(raw.get("run_dir"), "run_dir"), tiers=tuple(tiers),
                  staging=staging_cfg, peer=peer_cfg,
                  report=None if report is None else r.path(report, "report"))

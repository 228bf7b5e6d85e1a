"""YAML configuration: load, expand ``${VAR}``, validate up front, freeze.

The shipped defaults (``monarch/defaults.yaml``) and the dataclasses below are the schema;
``tests/unit/test_config.py`` keeps them and ``configs/local.yaml`` in sync.
Every error names the file, the key and the fix.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from monarch.errors import ConfigError
from monarch.protocol import MAX_TIERS
from monarch.sizes import parse_size

log = logging.getLogger(__name__)

DEFAULTS_FILE = Path(__file__).with_name("defaults.yaml")
POLICIES = ("read-ahead", "on-access", "off")
RENAMED_POLICIES = {"prestage": "read-ahead"}  # older names still accepted, with a warning
VALIDATE_MODES = ("none", "open")
COMPRESSION_MODES = ("off", "zstd", "auto")
PRIVATE_PREFIX = "monarch-"  # Monarch's own directory in a base directory: monarch-<uid>

_SHARE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class TierConfig:
    name: str
    path: str  # a base directory: Monarch keeps its copies in its own monarch-<uid>/... inside
    capacity: int  # bytes (0 when capacity_share is set)
    keep: bool = False  # keep staged files after the job (reused by the next job)
    capacity_share: float | None = None  # "50%": a share of the node's available memory (tmpfs) or free space
    compression: str = "off"  # off | zstd | auto: store copies compressed (monarch/node/codecs.py)
    decoded_cache: int = -1  # bytes of decoded files kept for native re-opens; -1 ("room"): the tier's free room


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
    validate: str = "none"  # "open": compare size and mtime with the PFS at a file's first open in a job


@dataclass(frozen=True)
class PeerConfig:
    path: str  # a base directory, like TierConfig.path
    capacity: int
    timeout: float = 10.0
    replicas: int = 1  # 2: a second copy of each owned file on the node that takes it over on a loss


@dataclass(frozen=True)
class Config:
    source: str  # where it came from, for messages
    dataset: DatasetConfig
    run_dir: str  # a base directory: the run's socket, counters and log go in monarch-<uid>/... inside
    tiers: tuple[TierConfig, ...]
    staging: StagingConfig
    peer: PeerConfig
    report: str | None = None  # JSON report path; default: the run's directory (monarch/layout.py)
    report_html: str | None = None  # HTML report path (monarch run); None: none
    memory_margin: int = 0  # bytes of available memory memory-backed tiers leave to the node...
    memory_margin_share: float | None = 0.10  # ...or this share of its total memory

    def bases(self) -> list[tuple[str, str]]:
        """(key, path) of every base directory configured: Monarch works in monarch-<uid> inside."""
        return ([("run_dir", self.run_dir)] + [(f"tiers[{i}].path", t.path) for i, t in enumerate(self.tiers)]
                + [("peer.path", self.peer.path)])


def base_problem(source: str, key: str, base: str) -> str | None:
    """Why the base ``key`` cannot be used on this node (missing, or open to another user:
    monarch/secure.py ``open_base``), as a configuration error's line; None if it can."""
    from monarch.secure import UnsafeBaseError, resolve_base
    try:
        resolve_base(base)
    except UnsafeBaseError as e:
        return f"config {source}: {key}: {e}"
    return None


def base_problems(config: Config) -> list[str]:
    """``base_problem`` of every configured base (one base named by two keys: once)."""
    seen: set[str] = set()
    out = []
    for key, base in config.bases():
        if base not in seen:
            seen.add(base)
            problem = base_problem(config.source, key, base)
            if problem:
                out.append(problem)
    return out


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}``, defaults nested (``${A:-${B:-c}}``) and expanded only when used.

    An unset variable without a default raises KeyError(name); a malformed ``${...}`` raises
    ValueError saying what is wrong. A ``$`` not followed by ``{`` is kept as it is.
    """
    out: list[str] = []
    i = 0
    while True:
        start = text.find("${", i)
        if start < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:start])
        m = _NAME_RE.match(text, start + 2)
        if not m:
            raise ValueError(f"{text[start:start + 12]!r}...: expected a variable name after '${{'")
        name, pos = m.group(0), m.end()
        if text.startswith("}", pos):
            value = env.get(name)
            if value is None:
                raise KeyError(name)
            out.append(value)
            i = pos + 1
        elif text.startswith(":-", pos):
            end = _closing_brace(text, pos + 2)
            if end < 0:
                raise ValueError(f"${{{name}:-... has no closing '}}'")
            value = env.get(name)
            out.append(value if value else expand_vars(text[pos + 2:end], env))
            i = end + 1
        else:
            raise ValueError(f"${{{name}...: only ${{{name}}} and ${{{name}:-default}} are understood")


def _closing_brace(text: str, pos: int) -> int:
    """Index of the ``}`` that closes a ``${`` whose body starts at ``pos`` (nested ``${}`` skipped), or -1."""
    depth = 0
    while pos < len(text):
        if text.startswith("${", pos):
            depth += 1
            pos += 2
            continue
        if text[pos] == "}":
            if depth == 0:
                return pos
            depth -= 1
        pos += 1
    return -1


def builtin_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for expansion, with the variables Monarch itself provides."""
    from monarch.launch.topology import node_index, run_id, user_name
    out = dict(os.environ if env is None else env)
    out.setdefault("MONARCH_NODE", str(node_index(out)))
    out.setdefault("MONARCH_JOB_ID", run_id(out) or "local")  # `monarch run` names an unnamed run
    out.setdefault("USER", user_name())
    return out


def load_config(path: str | os.PathLike | None, env: Mapping[str, str] | None = None, *,
                roots: Sequence[str] | None = None, check_roots: bool = True) -> Config:
    """Load ``path`` over the shipped defaults (``None``: the defaults alone).

    ``roots`` (``monarch run --dataset``) replaces ``dataset.roots``. With ``check_roots``
    every root must be a readable directory. All problems found are raised together as one
    ConfigError, one line each.
    """
    env = builtin_env(env)
    raw = _read_yaml(DEFAULTS_FILE, str(DEFAULTS_FILE))
    source = str(DEFAULTS_FILE)
    errors: list[str] = []
    if path is not None:
        source = str(path)
        user = _read_yaml(Path(path), source)
        _check_keys(user, raw, source, "", errors)
        raw = _merge(raw, user)
    if roots is not None:
        raw = _merge(raw, {"dataset": {"roots": list(roots)}})
    return _validate(raw, source, env, errors, check_roots=check_roots,
                     roots_origin=None if roots is None else "--dataset")


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


def _check_keys(user: Any, defaults: Any, source: str, where: str, errors: list[str]) -> None:
    """Unknown keys are typos: say which and list the known ones (every one of them, into ``errors``)."""
    if not isinstance(user, dict) or not isinstance(defaults, dict):
        return
    for key, value in user.items():
        here = f"{where}.{key}" if where else str(key)
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            errors.append(f"config {source}: {here}: unknown key; known keys here: {known}")
            continue
        _check_keys(value, defaults[key], source, here, errors)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def combine_errors(source: str, errors: list[str]) -> str:
    """One message for all problems of a file: the problem itself, or a count and one line each."""
    if len(errors) == 1:
        return errors[0]
    return f"config {source}: {len(errors)} errors:\n" + "\n".join(f"  {e}" for e in errors)


class _Reader:
    """Typed access to the raw mapping. Each check raises a ConfigError; ``get`` records it and goes on."""

    def __init__(self, source: str, env: Mapping[str, str], errors: list[str]):
        self.source, self.env, self.errors = source, env, errors

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"config {self.source}: {key}: {problem}")

    def error(self, key: str, problem: str) -> None:
        self.errors.append(str(self.fail(key, problem)))

    def get(self, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``, or None with its problem recorded."""
        try:
            return check(*args)
        except ConfigError as e:
            self.errors.append(str(e))
            return None

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.fail(key, f"expected a string, got {value!r}")
        try:
            return expand_vars(str(value), self.env)
        except KeyError as e:
            raise self.fail(key, f"${{{e.args[0]}}} is not set; set it in the environment "
                                 f"or give a default as ${{{e.args[0]}:-value}}") from None
        except ValueError as e:
            raise self.fail(key, f"{e}; write ${{VAR}} or ${{VAR:-default}}") from None

    def path(self, value: Any, key: str) -> str:
        return os.path.abspath(self._path_text(value, key))

    def _path_text(self, value: Any, key: str) -> str:
        text = os.path.expanduser(self.string(value, key))
        if not text:
            raise self.fail(key, "expected a path, got an empty string")
        if ":" in text:
            raise self.fail(key, f"paths may not contain ':' (it separates paths for the shim), got {text!r}")
        return text

    def root(self, value: Any, key: str, hint: str) -> str:
        """A dataset root: an existing directory this user can list and read."""
        text = self._path_text(value, key)
        path = os.path.abspath(text)
        if not os.path.exists(path):
            shown = path if os.path.isabs(text) else \
                f"{text} (relative, so taken from the current directory as {path})"
            raise self.fail(key, f"{shown} does not exist; {hint}")
        if not os.path.isdir(path):
            raise self.fail(key, f"{path} is not a directory; a root is the top directory of the dataset "
                                 "(Monarch manages the files below it)")
        if not os.access(path, os.R_OK | os.X_OK):
            raise self.fail(key, f"{path} is not readable by you (a root needs read and search permission); "
                                 "fix its permissions or choose another root")
        return path

    def size(self, value: Any, key: str) -> int:
        try:
            return parse_size(self.string(value, key) if isinstance(value, str) else value)
        except ValueError:
            raise self.fail(key, f'expected a size like "64GiB" (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), '
                                 f"got {value!r}") from None

    def amount(self, value: Any, key: str, whole: str) -> tuple[int, float | None]:
        """A size in bytes, or a share of ``whole`` like ``"50%"``: (bytes, None) or (0, share)."""
        text = self.string(value, key) if isinstance(value, str) else value
        m = _SHARE_RE.match(text) if isinstance(text, str) else None
        if m is None:
            try:
                return parse_size(text), None
            except ValueError:
                raise self.fail(key, f'expected a size like "64GiB" (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) '
                                     f'or a share of {whole} like "50%", got {value!r}') from None
        share = float(m.group(1))
        if not 0 < share <= 100:
            raise self.fail(key, f"a share of {whole} must be more than 0% and at most 100%, got {value!r}")
        return 0, share / 100

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

    def choice(self, value: Any, key: str, choices: tuple[str, ...]) -> str:
        text = self.string(value, key)
        if text not in choices:
            raise self.fail(key, f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    def mapping(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping of keys, got {value!r}")
        return value


_NO_ROOTS = ("no dataset roots: list the directories Monarch manages, or set MONARCH_DATASET "
             "for the default configuration (or give monarch run --dataset PATH)")


def _roots(r: _Reader, raw: dict, check: bool, origin: str | None) -> tuple[str, ...] | None:
    """The dataset roots, canonical; None when they are wrong (the problems are recorded)."""
    dataset = r.get(r.mapping, raw.get("dataset"), "dataset")
    if dataset is None:
        return None
    roots = dataset.get("roots")
    if isinstance(roots, str):
        roots = [roots]
    if roots is not None and not isinstance(roots, list):
        r.error("dataset.roots", f"expected a list of directories, got {roots!r}")
        return None
    texts = [r.get(r.string, v, f"dataset.roots[{i}]") for i, v in enumerate(roots or [])]
    if None in texts:
        return None
    if not any(texts):
        r.error("dataset.roots", _NO_ROOTS)
        return None
    out = []
    for i, (text, value) in enumerate(zip(texts, roots)):
        key = f"dataset.roots[{i}]" + (f" (from {origin})" if origin else "")
        if not check:
            out.append(r.get(r.path, value, key))
            continue
        if origin:
            hint = f"check the path given with {origin}"
        elif "MONARCH_DATASET" in str(value):
            hint = "check MONARCH_DATASET or the path"
        else:
            hint = "check the path (the dataset must be reachable on this node)"
        out.append(r.get(r.root, value, key, hint))
    return None if None in out else tuple(out)


def _private_dir(base: str) -> str:
    """The directory Monarch owns inside a base directory (tiers[].path, peer.path, run_dir)."""
    return os.path.join(os.path.realpath(base), f"{PRIVATE_PREFIX}{os.getuid()}")


def _check_outside_roots(r: _Reader, key: str, base: str, roots: tuple[str, ...]) -> None:
    mine = _private_dir(base)
    for root in roots:
        if mine == root or mine.startswith(root + os.sep) or root.startswith(mine + os.sep):
            r.error(key, f"{base} would put Monarch's copies in {mine}, which overlaps the dataset root "
                         f"{root}; choose a base directory outside the dataset")
            return


def _tiers(r: _Reader, raw: dict, roots: tuple[str, ...] | None) -> list[TierConfig] | None:
    tiers_raw = raw.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        r.error("tiers", "expected a list of tiers, fastest first (name, path, capacity)")
        return None
    if len(tiers_raw) > MAX_TIERS:
        r.error("tiers", f"at most {MAX_TIERS} tiers, got {len(tiers_raw)}")
        return None
    known = [f.name for f in fields(TierConfig) if f.name != "capacity_share"]  # a share is written as capacity
    tiers: list[TierConfig | None] = []
    names: list[str] = []
    for i, t in enumerate(tiers_raw):
        key = f"tiers[{i}]"
        t = r.get(r.mapping, t, key)
        if t is None:
            tiers.append(None)
            continue
        for unknown in sorted(set(t) - set(known)):
            r.error(f"{key}.{unknown}", f"unknown key; known keys here: {', '.join(sorted(known))}")
        missing = [k for k in ("name", "path", "capacity") if k not in t]
        for k in missing:
            r.error(f"{key}.{k}", "missing; every tier needs name, path and capacity")
        name = r.get(r.string, t["name"], f"{key}.name") if "name" in t else None
        if name is not None and (name in ("pfs", "peer") or not re.fullmatch(r"[A-Za-z0-9_-]+", name)):
            r.error(f"{key}.name", f"{name!r} is not allowed: use letters, digits, '-' or '_', "
                                   "and not 'pfs' or 'peer' (report sources)")
            name = None
        elif name is not None and name in names:
            r.error(f"{key}.name", f"{name!r} is used by another tier; tier names must differ")
        if name is not None:
            names.append(name)
        path = r.get(r.path, t["path"], f"{key}.path") if "path" in t else None
        if path is not None and roots:
            _check_outside_roots(r, f"{key}.path", path, roots)
        amount = r.get(r.amount, t["capacity"], f"{key}.capacity",
                       "the node (of available memory for a tier on tmpfs/ramfs, else of free space)") \
            if "capacity" in t else None
        keep = r.get(r.boolean, t.get("keep", False), f"{key}.keep")
        compression = t.get("compression", "off")
        if compression is False:  # YAML reads a bare `off` as false
            compression = "off"
        compression = r.get(r.choice, compression, f"{key}.compression", COMPRESSION_MODES)
        decoded = t.get("decoded_cache", "room")
        if decoded is False or decoded == "off":
            decoded = 0
        elif decoded == "room":
            decoded = -1
        else:
            decoded = r.get(r.size, decoded, f"{key}.decoded_cache")
        ok = None not in (name, path, amount, keep, compression, decoded) and not missing
        tiers.append(TierConfig(name=name, path=path, capacity=amount[0], keep=keep, capacity_share=amount[1],
                                compression=compression, decoded_cache=decoded)
                     if ok else None)
    return None if None in tiers else tiers


def _threads(r: _Reader, value: Any) -> int:
    """``auto`` (0: adapted to what the sources give) or a whole number of copies in flight."""
    if value == "auto":
        return 0
    if isinstance(value, str):
        raise r.fail("staging.threads", f'expected "auto" or a whole number of copies in flight, got {value!r}')
    return r.number(value, "staging.threads", int, 1)


def _policy(r: _Reader, value: Any) -> str:
    """``staging.policy``; an older name is taken as its new one, with a warning that says so."""
    if isinstance(value, str) and value in RENAMED_POLICIES:
        new = RENAMED_POLICIES[value]
        log.warning("config %s: staging.policy: %r is the older name of %r; write %s", r.source, value, new, new)
        return new
    return r.choice(value, "staging.policy", POLICIES)


def _staging(r: _Reader, raw: dict) -> StagingConfig | None:
    staging = r.get(r.mapping, raw.get("staging"), "staging")
    if staging is None:
        return None
    values = {
        "policy": r.get(_policy, r, staging.get("policy")),
        "threads": r.get(_threads, r, staging.get("threads")),
        "resolve_timeout": r.get(r.number, staging.get("resolve_timeout"), "staging.resolve_timeout", float, 0.1),
        "validate": r.get(r.choice, staging.get("validate"), "staging.validate", VALIDATE_MODES),
    }
    return None if None in values.values() else StagingConfig(**values)


def _peer(r: _Reader, raw: dict, roots: tuple[str, ...] | None) -> PeerConfig | None:
    peer = r.get(r.mapping, raw.get("peer"), "peer")
    if peer is None:
        return None
    path = r.get(r.path, peer.get("path"), "peer.path")
    if path is not None and roots:
        _check_outside_roots(r, "peer.path", path, roots)
    capacity = r.get(r.size, peer.get("capacity"), "peer.capacity")
    timeout = r.get(r.number, peer.get("timeout"), "peer.timeout", float, 0.1)
    replicas = r.get(_replicas, r, peer.get("replicas"))
    return None if None in (path, capacity, timeout, replicas) else \
        PeerConfig(path=path, capacity=capacity, timeout=timeout, replicas=replicas)


def _replicas(r: _Reader, value: Any) -> int:
    if isinstance(value, bool) or value not in (1, 2):
        raise r.fail("peer.replicas", "expected 1 (each file kept by its owner only) or 2 (a second copy on the "
                                      f"node that takes the file over when its owner is lost), got {value!r}")
    return int(value)


def _validate(raw: dict, source: str, env: Mapping[str, str], errors: list[str], *,
              check_roots: bool = True, roots_origin: str | None = None) -> Config:
    r = _Reader(source, env, errors)
    given = _roots(r, raw, check_roots, roots_origin)  # absolute, as configured
    roots = None if given is None else tuple(os.path.realpath(g) for g in given)
    tiers = _tiers(r, raw, roots)
    staging = _staging(r, raw)
    peer = _peer(r, raw, roots)
    run_dir = r.get(r.path, raw.get("run_dir"), "run_dir")
    report = raw.get("report")
    report_path = None if report is None else r.get(r.path, report, "report")
    report_html = raw.get("report_html")
    report_html_path = None if report_html is None else r.get(r.path, report_html, "report_html")
    margin = r.get(r.amount, raw.get("memory_margin"), "memory_margin", "the node's total memory")
    if errors:
        raise ConfigError(combine_errors(source, errors))
    return Config(source=source, dataset=DatasetConfig(roots=roots, given=given), run_dir=run_dir, tiers=tuple(tiers),
                  staging=staging, peer=peer, report=report_path, report_html=report_html_path,
                  memory_margin=margin[0], memory_margin_share=margin[1])

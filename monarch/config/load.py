"""Load a configuration: read YAML, expand ``${VAR}``, merge it over the defaults, check every key, freeze.

The keys, their defaults and checks are declared once in ``keys.py``; this module runs them
over the raw mapping and builds the dataclasses of ``model.py``. The shipped ``defaults.yaml``
holds the same defaults (``tests/unit/config/`` keeps them, and ``configs/local.yaml``,
in sync). Every error names the file, the key and the fix.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from monarch.config.keys import ENV_WRITEBACK, RENAMED_KEYS, REQUIRED, TIER_KEYS, Key, default_tree, section_keys
from monarch.config.model import Config, DatasetConfig, PeerConfig, StagingConfig, TierConfig, WritebackConfig
from monarch.errors import ConfigError
from monarch.protocol import MAX_TIERS
from monarch.sizes import parse_size

log = logging.getLogger(__name__)

DEFAULTS_FILE = Path(__file__).with_name("defaults.yaml")
# how a message names the defaults: a file the user never wrote is said to be the shipped one
DEFAULTS_SOURCE = f"{DEFAULTS_FILE} (the shipped defaults)"
PRIVATE_PREFIX = "monarch-"  # Monarch's own directory in a base directory: monarch-<uid>

_SHARE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# YAML 1.1 reads these unquoted as booleans; a string key given one gets this hint
_YAML_BOOLS = "YAML reads an unquoted off, on, no, yes as false or true: quote it, e.g. \"off\""


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
    from monarch.topology import node_index, run_id, user_name
    out = dict(os.environ if env is None else env)
    out.setdefault("MONARCH_NODE", str(node_index(out)))
    out.setdefault("MONARCH_JOB_ID", run_id(out) or "local")  # `monarch run` names an unnamed run
    out.setdefault("USER", user_name())
    return out


def load_config(path: str | os.PathLike | None, env: Mapping[str, str] | None = None, *,
                roots: Sequence[str] | None = None, check_roots: bool = True) -> Config:
    """Load ``path`` over the shipped defaults (``None``: the defaults alone).

    ``roots`` (``monarch run --dataset``) replaces ``dataset.roots``, and ``MONARCH_WRITEBACK``
    (set, even empty) ``writeback.paths``. With ``check_roots`` every root must be a readable
    directory and every write-back path a writable one. All problems found are raised together as
    one ConfigError, one line each.
    """
    env = builtin_env(env)
    raw = default_tree()  # the declared defaults, which defaults.yaml holds too (tested)
    source = DEFAULTS_SOURCE
    errors: list[str] = []
    if path is not None:
        source = str(path)
        user = _renamed_keys(_read_yaml(Path(path), source), source, errors, warn=True)
        _check_keys(user, raw, source, "", errors)
        raw = _merge(raw, user)
    if roots is not None:
        raw = _merge(raw, {"dataset": {"roots": list(roots)}})
    writeback = env.get(ENV_WRITEBACK)
    if writeback is not None:  # the job's, or Monarch's for its processes: a nested run takes the same paths
        raw = _merge(raw, {"writeback": {"paths": writeback.split(":")}})
    return _validate(raw, source, env, errors, check_roots=check_roots,
                     roots_origin=None if roots is None else "--dataset", writeback_origin=writeback is not None,
                     peer_given=path is not None and user.get("peer") is not None)


def read_user(path: str | os.PathLike) -> dict:
    """The keys a configuration file sets, as written (no defaults, nothing checked but the YAML),
    an older key name under its new one (``load_config`` warns of it)."""
    return _renamed_keys(_read_yaml(Path(path), str(path)), str(path), [], warn=False)


def _renamed_keys(user: dict, source: str, errors: list[str], *, warn: bool) -> dict:
    """``user`` with each older key name (``RENAMED_KEYS``) under its new one, and a warning that
    names the new one; both names given is an error (which one was meant?)."""
    out = dict(user)
    for old, new in RENAMED_KEYS.items():
        if old not in out:
            continue
        if new in out:
            errors.append(f"config {source}: {old}: the older name of {new}, which is given too; "
                          f"remove {old}")
            del out[old]
            continue
        if warn:
            log.warning("config %s: %s: the older name of %s; write %s", source, old, new, new)
        out = {new if k == old else k: v for k, v in out.items()}  # in its place, for check-config's listing
    return out


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
        if defaults[key] != {}:  # an empty mapping by default (dataset.stores) takes any keys: its check reads them
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


class _Recorded(ConfigError):
    """A check whose problems are already recorded, one per line (the dataset roots)."""


class _Reader:
    """Typed access to the raw mapping. Each check raises a ConfigError; ``get`` records it and goes on."""

    def __init__(self, source: str, env: Mapping[str, str], errors: list[str], *,
                 check_roots: bool = True, roots_origin: str | None = None, writeback_origin: bool = False):
        self.source, self.env, self.errors = source, env, errors
        self.check_roots, self.roots_origin = check_roots, roots_origin
        self.writeback_origin = writeback_origin  # writeback.paths come from MONARCH_WRITEBACK
        self.dataset_roots: tuple[str, ...] | None = None  # canonical, once read: base directories stay outside
        self.store_roots: set[str] = set()  # roots served from a store (dataset.stores): no directory needed

    def warn(self, key: str, problem: str) -> None:
        log.warning("config %s: %s: %s", self.source, key, problem)

    def fail(self, key: str, problem: str) -> ConfigError:
        if key.endswith(")") and " (from " in key:
            return ConfigError(f"{key}: {problem}")  # given on the command line or by the environment, not the file
        return ConfigError(f"config {self.source}: {key}: {problem}")

    def error(self, key: str, problem: str) -> None:
        self.errors.append(str(self.fail(key, problem)))

    def get(self, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``, or None with its problem recorded."""
        try:
            return check(*args)
        except _Recorded:
            return None
        except ConfigError as e:
            self.errors.append(str(e))
            return None

    def string(self, value: Any, key: str) -> str:
        if isinstance(value, bool):
            raise self.fail(key, f"expected a string, got {value!r} ({_YAML_BOOLS})")
        if not isinstance(value, (str, int, float)):
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

    def base(self, value: Any, key: str) -> str:
        """A base directory for Monarch's copies: its monarch-<uid> inside must stay out of the dataset."""
        path = self.path(value, key)
        if self.dataset_roots:
            _check_outside_roots(self, key, path, self.dataset_roots)
        return path

    def roots(self, value: Any, key: str) -> tuple[str, ...]:
        """``dataset.roots``, absolute as configured (``_roots``); raises when any is wrong."""
        given = _roots(self, value, self.check_roots, self.roots_origin)
        if given is None:
            raise _Recorded()
        self.dataset_roots = tuple(os.path.realpath(g) for g in given)
        return given

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
        if path in self.store_roots:  # served from a key-value store: no directory on disk
            return path
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
        if value is False and "off" in choices:  # YAML reads a bare `off` as false
            return "off"
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


def _roots(r: _Reader, roots: Any, check: bool, origin: str | None) -> tuple[str, ...] | None:
    """The dataset roots, absolute as configured; None when they are wrong (the problems are recorded)."""
    if isinstance(roots, str):
        roots = [roots]
    if roots is not None and not isinstance(roots, list):
        r.error("dataset.roots", f"expected a list of directories, got {roots!r}")
        return None
    texts = [r.get(r.string, v, f"dataset.roots[{i}]") for i, v in enumerate(roots or [])]
    if None in texts:
        return None
    if not any(texts):
        if not check:  # stopping a daemon, planning a synthetic dataset: no dataset is needed
            return ()
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
    """The directory Monarch owns inside a base directory (tiers[].path, peer.path, run_base)."""
    return os.path.join(os.path.realpath(base), f"{PRIVATE_PREFIX}{os.getuid()}")


def _check_outside_roots(r: _Reader, key: str, base: str, roots: tuple[str, ...]) -> None:
    mine = _private_dir(base)
    for root in roots:
        if mine == root or mine.startswith(root + os.sep) or root.startswith(mine + os.sep):
            r.error(key, f"{base} would put Monarch's copies in {mine}, which overlaps the dataset root "
                         f"{root}; choose a base directory outside the dataset")
            return



def _check_stores(r: _Reader, stores: tuple, given: tuple, staging: dict, tiers: list) -> None:
    """Every store's root is a dataset root; a store's files cannot be validated at open, nor
    kept copies adopted across jobs (the manifest's version does not key them yet)."""
    for root, _ in stores:
        if root not in given:
            r.error(f"dataset.stores[{root!r}]", f"{root} is not one of dataset.roots ({', '.join(given)}); "
                                                 "a store is mounted at one of the roots")
    for i, tier in enumerate(tiers):
        if stores and tier.keep:
            r.error(f"tiers[{i}].keep", "true is not supported with dataset.stores yet (kept copies are not checked "
                                        "against the store's manifest version); use false")
    if stores and staging["policy"] == "off":
        r.error("staging.policy", "off serves only kept copies, and a store's root has no PFS to read either: every "
                                  "open would fail; use read-ahead or on-access with dataset.stores")
    if stores and staging["validate"] == "open":
        r.error("staging.validate", "open compares each file with the PFS, and a store's root has none; "
                                    "use none with dataset.stores (a store's values are checked against "
                                    "the manifest's digests)")


def _check_writeback(r: _Reader, writeback: dict, tiers: list) -> None:
    names = [t.name for t in tiers]
    if writeback["tier"] is not None and writeback["tier"] not in names:
        r.error("writeback.tier", f"{writeback['tier']!r} is not a tier of this configuration ({', '.join(names)}); "
                                  "name one of them, or leave it out for the first")


def _read_key(r: _Reader, key: Key, value: Any, where: str) -> dict[str, Any] | None:
    """The dataclass fields of one key's value, or None with its problem recorded."""
    before = len(r.errors)
    checked = r.get(key.check, r, value, where)
    return None if len(r.errors) > before else key.spread(checked)


def _section(r: _Reader, raw: dict, section: str) -> dict[str, Any] | None:
    """The checked fields of a mapping's keys (``""``: the top level); None when any is wrong."""
    where = f"{section}." if section else ""
    mapping = r.get(r.mapping, raw.get(section), section) if section else raw
    if mapping is None:
        return None
    out: dict[str, Any] | None = {}
    for key in section_keys(section):
        fields = _read_key(r, key, mapping.get(key.name), where + key.name)
        out = None if out is None or fields is None else {**out, **fields}
    return out


def _tiers(r: _Reader, raw: dict) -> list[TierConfig] | None:
    tiers_raw = raw.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        r.error("tiers", "expected a list of tiers, fastest first (name, path, capacity)")
        return None
    if len(tiers_raw) > MAX_TIERS:
        r.error("tiers", f"at most {MAX_TIERS} tiers, got {len(tiers_raw)}")
        return None
    known = [k.name for k in TIER_KEYS]
    required = [k.name for k in TIER_KEYS if k.default == REQUIRED]
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
        values: dict[str, Any] | None = {}
        for k in TIER_KEYS:
            if k.name not in t and k.default == REQUIRED:
                r.error(f"{key}.{k.name}", f"missing; every tier needs {', '.join(required[:-1])} and {required[-1]}")
                values = None
                continue
            fields = _read_key(r, k, t.get(k.name, k.default), f"{key}.{k.name}")
            values = None if values is None or fields is None else {**values, **fields}
            if k.name == "name" and fields is not None:
                if fields["name"] in names:
                    r.error(f"{key}.name", f"{fields['name']!r} is used by another tier; tier names must differ")
                names.append(fields["name"])
        tiers.append(None if values is None else TierConfig(**values))
    return None if None in tiers else tiers


def _validate(raw: dict, source: str, env: Mapping[str, str], errors: list[str], *, check_roots: bool = True,
              roots_origin: str | None = None, writeback_origin: bool = False, peer_given: bool = False) -> Config:
    r = _Reader(source, env, errors, check_roots=check_roots, roots_origin=roots_origin,
                writeback_origin=writeback_origin)
    stores = raw.get("dataset", {}).get("stores") if isinstance(raw.get("dataset"), dict) else None
    if isinstance(stores, dict):  # a store's root needs no directory (dataset.stores is checked below)
        for k in stores:
            try:
                r.store_roots.add(os.path.abspath(os.path.expanduser(expand_vars(str(k), env))))
            except (KeyError, ValueError):
                pass  # reported where dataset.stores is read
    dataset = _section(r, raw, "dataset")  # first: the base directories are checked against the roots
    top = _section(r, raw, "")
    tiers = _tiers(r, raw)
    staging = _section(r, raw, "staging")
    peer = _section(r, raw, "peer")
    writeback = _section(r, raw, "writeback")  # after the dataset: its paths stay outside the roots
    if errors:
        raise ConfigError(combine_errors(source, errors))
    given = dataset["roots"]
    _check_stores(r, dataset["stores"], given, staging, tiers)
    _check_writeback(r, writeback, tiers)
    if errors:
        raise ConfigError(combine_errors(source, errors))
    return Config(source=source, dataset=DatasetConfig(roots=r.dataset_roots, given=given, stores=dataset["stores"],
                                                                manifest=dataset["manifest"]),
                  tiers=tuple(tiers),
                  staging=StagingConfig(**staging), peer=PeerConfig(**peer), peer_given=peer_given,
                  writeback=WritebackConfig(**writeback), **top)

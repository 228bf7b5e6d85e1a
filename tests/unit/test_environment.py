"""Every MONARCH_* environment variable declared once (monarch/environment.py): each one Monarch
reads -- in its Python (``os.environ[...]``, ``os.environ.get``, ``os.getenv``, ``env.get(...)``,
``"MONARCH_X" in env``, through constants such as ``protocol.ENV_SOCKET``), in a configuration's
``${MONARCH_X}``, or in the C shim and front door (``getenv``, the ``MONARCH_ENV_*`` macros) --
is declared; `monarch run --help` and docs/configuration.md's table are the declarations."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

from monarch import environment
from monarch.cli import main
from monarch.environment import TABLE_BEGIN, TABLE_END, VARIABLES

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "monarch"
NAME = re.compile(r"MONARCH_[A-Z0-9_]+")
ENV_LIKE = re.compile(r"(^|_)(env|environ|environment)$")  # os.environ, env, self.env, self._env
READ_METHODS = ("get", "getenv", "pop", "setdefault")


# -- the scanners --------------------------------------------------------------------------

def _env_like(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return bool(ENV_LIKE.search(name))


def _loop_sources(tree: ast.AST) -> dict[str, list[ast.expr]]:
    """Loop variables (``for var in X``, comprehensions) -> the iterables they range over."""
    found: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            found.setdefault(node.target.id, []).append(node.iter)
    return found


class _Resolver:
    """The string values an expression of a module stands for: a literal, or a name evaluated
    in the imported module (``protocol.ENV_SOCKET``, ``topology.NODE_VARS``), or a loop variable's
    iterable."""

    def __init__(self, module_name: str | None, tree: ast.AST):
        self.module_name, self.loops, self._namespace = module_name, _loop_sources(tree), None

    def namespace(self) -> dict:
        if self._namespace is None:
            self._namespace = vars(importlib.import_module(self.module_name)) if self.module_name else {}
        return self._namespace

    def values(self, expr: ast.expr, depth: int = 0) -> set[str]:
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.values(e, depth) for e in expr.elts)) if expr.elts else set()
        if not isinstance(expr, (ast.Name, ast.Attribute)) or depth > 3:
            return set()
        namespace = dict(self.namespace())  # a module that cannot be imported fails the test here
        try:
            value = eval(compile(ast.Expression(expr), "<expr>", "eval"), namespace)
        except Exception:
            if isinstance(expr, ast.Name) and expr.id in self.loops:
                return set().union(*(self.values(i, depth + 1) for i in self.loops[expr.id]))
            return set()
        if isinstance(value, str):
            return {value}
        if isinstance(value, (tuple, list, set, frozenset)):
            return {v for v in value if isinstance(v, str)}
        return set()


def python_reads(source: str, module_name: str | None) -> set[str]:
    """The MONARCH_* names a Python module reads from (or sets in) an environment, or expands
    in a configuration (``${MONARCH_X...}``), or names as an ``ENV_*`` constant."""
    tree = ast.parse(source)
    resolve = _Resolver(module_name, tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if node.args and isinstance(func, ast.Attribute) and (
                    (func.attr in READ_METHODS and _env_like(func.value))
                    or (func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os")):
                names |= resolve.values(node.args[0])
        elif isinstance(node, ast.Subscript) and _env_like(node.value):
            names |= resolve.values(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and _env_like(node.comparators[-1]):
            names |= resolve.values(node.left)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "${MONARCH_" in node.value:
            names |= set(re.findall(r"\$\{(MONARCH_[A-Z0-9_]+)", node.value))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if any(isinstance(t, ast.Name) and t.id.startswith("ENV_") for t in node.targets):
                names.add(node.value.value)  # ENV_X = "MONARCH_X": the name of a variable read through it
    return {n for n in names if NAME.fullmatch(n)}


def c_reads(sources: dict[str, str]) -> set[str]:
    """The MONARCH_* names C sources read: ``getenv("MONARCH_X")``, and every use of a macro
    ``#define MONARCH_ENV_X "MONARCH_X"`` (``getenv(MONARCH_ENV_X)``, ``monarch_env_ms(MONARCH_ENV_X, ...)``)."""
    macros: dict[str, str] = {}
    for text in sources.values():
        macros.update(re.findall(r'#define\s+(MONARCH_ENV_\w+)\s+"(MONARCH_[A-Z0-9_]+)"', text))
    names: set[str] = set()
    for path, text in sources.items():
        if not path.endswith(".c"):
            continue
        names |= set(re.findall(r'getenv\s*\(\s*"(MONARCH_[A-Z0-9_]+)"', text))
        for line in text.splitlines():
            if line.lstrip().startswith("#define"):
                continue
            for macro in re.findall(r"\bMONARCH_ENV_\w+\b", line):
                if macro not in macros:
                    raise AssertionError(f"{path}: {macro} is not #defined as a \"MONARCH_...\" name")
                names.add(macros[macro])
    return names


def monarch_python_reads() -> dict[str, set[str]]:
    """name -> the modules under monarch/ that read it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for name in python_reads(path.read_text(), module):
            found.setdefault(name, set()).add(str(rel))
    for path in sorted(PACKAGE.rglob("*.yaml")):  # the shipped defaults: ${MONARCH_X} expanded by the loader
        for name in re.findall(r"\$\{(MONARCH_[A-Z0-9_]+)", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def monarch_c_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for ext in ("*.c", "*.h") for p in sorted(PACKAGE.rglob(ext))}


# -- every read declared -------------------------------------------------------------------

def test_every_variable_monarch_reads_in_python_or_c_is_declared():
    declared = {v.name for v in VARIABLES}
    reads = monarch_python_reads()
    for name in c_reads(monarch_c_sources()):
        reads.setdefault(name, set()).add("monarch/shim, monarch/frontdoor (C)")
    undeclared = {name: sorted(where) for name, where in reads.items() if name not in declared}
    assert not undeclared, f"declare these in monarch/environment.py: {undeclared}"
    # the scan sees what it must (else it could pass by seeing nothing)
    assert {"MONARCH_SOCKET", "MONARCH_PROGRESS", "MONARCH_CLUSTER", "MONARCH_NODE", "MONARCH_FRONT_DOOR",
            "MONARCH_SSD", "MONARCH_JOB_ID"} <= set(reads)
    assert {"MONARCH_SHIM_TIMEOUT_MS", "MONARCH_SHIM_ZSTD", "MONARCH_DISABLE"} <= c_reads(monarch_c_sources())


def test_every_declared_variable_is_read_somewhere():
    """No stale declaration: each is read in monarch/ (Python, configuration or C), or, for the
    tests' and benchmarks' own, in tests/ or scripts/."""
    reads = set(monarch_python_reads()) | c_reads(monarch_c_sources())
    elsewhere = "\n".join(p.read_text() for d in ("tests", "scripts") for p in (REPO / d).rglob("*.py"))
    for var in VARIABLES:
        assert var.name in reads or (environment.TESTS in var.readers and var.name in elsewhere), var.name


def test_the_scan_finds_each_form_of_read_and_fails_on_an_undeclared_one(tmp_path, monkeypatch):
    """The scanners on a module that reads undeclared names in every form the test claims to see."""
    (tmp_path / "envnames.py").write_text('ENV_VIA_MODULE = "MONARCH_NEW_VIA_MODULE"\nLOOPED = ("MONARCH_NEW_LOOPED",)\n')
    source = textwrap.dedent('''
        import os
        import envnames
        from monarch import protocol
        ENV_LOCAL = "MONARCH_NEW_CONSTANT"
        def f(env, session):
            a = os.environ["MONARCH_NEW_SUBSCRIPT"]
            b = os.environ.get("MONARCH_NEW_ENVIRON_GET")
            c = os.getenv("MONARCH_NEW_GETENV")
            d = env.get("MONARCH_NEW_ENV_GET", "")
            e = "MONARCH_NEW_IN" in env
            g = env.get(envnames.ENV_VIA_MODULE)
            h = session.env[protocol.ENV_COUNTERS]
            for var in envnames.LOOPED:
                env.get(var)
        path = "${MONARCH_NEW_EXPANDED:-/tmp}"
    ''')
    (tmp_path / "reader.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = python_reads(source, "reader")
    assert found == {"MONARCH_NEW_SUBSCRIPT", "MONARCH_NEW_ENVIRON_GET", "MONARCH_NEW_GETENV", "MONARCH_NEW_ENV_GET",
                     "MONARCH_NEW_IN", "MONARCH_NEW_VIA_MODULE", "MONARCH_COUNTERS", "MONARCH_NEW_LOOPED",
                     "MONARCH_NEW_CONSTANT", "MONARCH_NEW_EXPANDED"}
    c = {"x.h": '#define MONARCH_ENV_NEW_MACRO "MONARCH_NEW_MACRO"\n',
         "x.c": 'const char *a = getenv("MONARCH_NEW_C");\nms(MONARCH_ENV_NEW_MACRO, &t);\n'}
    assert c_reads(c) == {"MONARCH_NEW_C", "MONARCH_NEW_MACRO"}
    declared = {v.name for v in VARIABLES}
    assert not (found | c_reads(c)) - {"MONARCH_COUNTERS"} & declared  # so the real test would fail on them


def test_the_constants_that_name_variables_are_declared():
    from monarch import frontdoor, protocol
    from monarch import topology
    from monarch.launch import progress, run
    constants = [getattr(protocol, n) for n in dir(protocol) if n.startswith("ENV_")]
    constants += [progress.ENV_PROGRESS, progress.ENV_INTERVAL, topology.ENV_JOB_ID, topology.ENV_RUN_ID,
                  frontdoor.ENV_FRONT_DOOR, run.ENV_CLUSTER, run.ENV_CLUSTER_WAIT, topology.NODE_VARS[0]]
    assert len(constants) > 12
    for name in constants + list(protocol.CLIENT_ENV_KEYS):
        assert environment.variable(name), name
    for name in protocol.CLIENT_ENV_KEYS:  # what the launcher exports from the daemon: Monarch sets them
        assert environment.variable(name).set_by in (environment.MONARCH, environment.BOTH), name


def test_declarations_are_well_formed():
    readers = {environment.LAUNCHER, environment.DAEMON, environment.CONFIG, environment.SHIM,
               environment.FRONT_DOOR, environment.HINTS, environment.WORKLOAD, environment.DEMO, environment.TESTS}
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)
    for var in VARIABLES:
        assert NAME.fullmatch(var.name), var.name
        assert var.kind in ("bool", "int", "float", "ms", "path", "paths", "str"), var.name
        assert var.readers and set(var.readers) <= readers, var.name
        assert var.set_by in (environment.USER, environment.MONARCH, environment.BOTH), var.name
        assert var.doc and "\n" not in var.doc, var.name


# -- what is generated from the declarations --------------------------------------------------

def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    return out.split("\nenvironment:\n", 1)[1].split("\n\n", 1)[0]


def test_run_help_shows_every_declared_variable_with_its_doc_for_the_user_facing_ones(capsys):
    section = _help(capsys, "run")
    shown = set(re.findall(r"^  (MONARCH_[A-Z0-9_]+)", section, re.M))  # a row of its own, with its doc
    user_facing = {v.name for v in VARIABLES if v.user_facing}
    assert shown == user_facing
    assert {"MONARCH_CLUSTER", "MONARCH_CLUSTER_WAIT", "MONARCH_DATASET", "MONARCH_DISABLE"} <= shown
    assert not shown & {"MONARCH_SOCKET", "MONARCH_COUNTERS", "MONARCH_ROOTS", "MONARCH_FUZZ_CASES"}
    named = set(re.findall(r"\b(MONARCH_[A-Z0-9_]+)\b", section))  # the others by name, on one line
    assert named == {v.name for v in VARIABLES}
    others = section.split("  (others)", 1)[1]
    assert "never by hand: MONARCH_ROOTS," in " ".join(others.split())


def test_serve_help_shows_the_daemons_variables(capsys):
    shown = set(re.findall(r"^  (MONARCH_[A-Z0-9_]+)", _help(capsys, "serve"), re.M))
    assert shown == {v.name for v in VARIABLES if v.user_facing
                     and {environment.DAEMON, environment.CONFIG} & set(v.readers)}
    assert "MONARCH_FRONT_DOOR" in shown and "MONARCH_PROGRESS" not in shown


def test_readme_table_is_the_declarations():
    """Fails when a variable is added or changed without `python3 scripts/config_table.py`."""
    readme = (REPO / "docs" / "configuration.md").read_text()
    begin, end = readme.index(TABLE_BEGIN) + len(TABLE_BEGIN), readme.index(TABLE_END)
    assert readme[begin:end].strip() == environment.table()
    for var in VARIABLES:
        assert sum(line.startswith(f"| `{var.name}` |") for line in readme[begin:end].splitlines()) == 1, var.name


def test_environment_imports_nothing_of_monarch():
    """Every floor may use it (the shim's build, scripts): it must not pull in the launcher or daemon."""
    tree = ast.parse((PACKAGE / "environment.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("monarch"), node.module
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("monarch") for a in node.names)
    assert "monarch" not in sys.modules["monarch.environment"].__dict__

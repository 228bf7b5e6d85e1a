"""The house's shape, held: no import circle in monarch/ (any import, in a function or under
TYPE_CHECKING included: each is an arrow a reader follows; and none through a package's
``__init__``), no module of monarch/node/ imports one that imports it, no Python module over
600 lines. ``python3 tests/support/import_graph.py [DIR]`` prints a tree's figures."""

from support.import_graph import PACKAGE, circles, import_graph, imported_back, layers, modules

MAX_LINES = 600


def test_the_import_graph_finds_a_circle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert layers(graph) == {"a": 1, "b": 1, "c": 1, "d": 2}


def test_a_module_imported_back_is_found_directly_and_through_others():
    graph = {"p.a": {"p.b"}, "p.b": {"q.c"}, "q.c": {"p.a"}, "p.d": {"p.a"}, "q.e": {"q.c"}, "q.f": {"q.e"}}
    assert imported_back(graph, "p") == [("p.a", "p.b")]  # q.c is outside p: its arrow is not p's
    assert imported_back({"p.a": {"p.b"}, "p.b": {"p.a"}}, "p") == [("p.a", "p.b"), ("p.b", "p.a")]


def test_the_import_graph_of_monarch_has_no_circle():
    graph = import_graph()
    assert "monarch.node.resolver" in graph and "monarch.node.snapshot" in graph["monarch.node.daemon"]
    assert circles(graph) == []


def test_no_circle_runs_through_a_package_init():
    """Importing ``monarch.cluster.placement`` runs ``monarch/cluster/__init__.py`` first."""
    graph = import_graph(packages=True)
    assert "monarch.cluster" in graph["monarch.node.cluster_role"]
    assert circles(graph) == []


def test_no_module_of_node_imports_one_that_imports_it():
    graph = import_graph(packages=True)
    assert imported_back(graph, "monarch.node") == []


def test_no_python_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    assert len(modules()) > 50 and PACKAGE.name == "monarch"

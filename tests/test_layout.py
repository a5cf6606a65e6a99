"""The house rules of the package: no import cycles, each pass imports only the passes below it, every public name has a docstring.

Every `import` of an alpaviz module counts, also one inside a function, so a
cycle cannot hide behind a lazy import.
"""

import ast
import importlib
import inspect
import pathlib
import types

import networkx as nx
import pytest

import alpaviz

ROOT = pathlib.Path(alpaviz.__file__).resolve().parent.parent
PACKAGE_DIRS = {"alpaviz": ROOT / "alpaviz", "alpaviz.core": ROOT / "core", "alpaviz.widgets": ROOT / "widgets"}

# Bottom to top.  A module may import its own pass and the passes before it in this list.
PASS_ORDER = (
    "alpaviz.core.graph",
    "alpaviz.core.cost",
    "alpaviz.core.plan",
    "alpaviz.core.models",
    "alpaviz.core.intra_op",
    "alpaviz.core.inter_op",
    "alpaviz.core.runtime",
    "alpaviz.core",
    "alpaviz.widgets",
    "alpaviz",
)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The alpaviz modules `name` imports, anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "alpaviz")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "alpaviz":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
    out.discard(name)
    return out


def _import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        for target in _imports(name, path):
            assert target in MODULES, f"{name} imports {target}, which is not a module of alpaviz"
            graph.add_edge(name, target)
    return graph


def _pass_of(module: str) -> str:
    return max((p for p in PASS_ORDER if module == p or module.startswith(p + ".")), key=len)


def test_the_layout_finds_every_pass():
    passes = {_pass_of(m) for m in MODULES}
    assert passes == set(PASS_ORDER)
    assert len(MODULES) > 40


def test_no_import_cycles_inside_alpaviz():
    cycles = list(nx.simple_cycles(_import_graph()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])


def test_each_pass_imports_only_the_passes_below_it():
    rank = {p: i for i, p in enumerate(PASS_ORDER)}
    upward = [
        f"{a} ({_pass_of(a)}) imports {b} ({_pass_of(b)})"
        for a, b in _import_graph().edges
        if rank[_pass_of(b)] > rank[_pass_of(a)]
    ]
    assert not upward, "\n".join(upward)


def test_other_passes_use_a_pass_only_through_its_public_package():
    """A private module (`alpaviz.core.plan._plan`) is imported from its own pass alone."""
    leaks = []
    for a, b in _import_graph().edges:
        private = any(part.startswith("_") for part in b.split("."))
        if private and _pass_of(a) != _pass_of(b):
            leaks.append(f"{a} imports {b}")
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize("facade", ["alpaviz", "alpaviz.core"])
def test_every_public_name_imports(facade):
    module = __import__(facade, fromlist=["__all__"])
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing and len(module.__all__) == len(set(module.__all__))


def test_the_import_graph_sees_a_planted_cycle(tmp_path, monkeypatch):
    """The checker itself: two modules that import each other are reported."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from alpaviz.core.graph import _b\n")
    b.write_text("from alpaviz.core.graph import _a\n")
    monkeypatch.setitem(MODULES, "alpaviz.core.graph._a", a)
    monkeypatch.setitem(MODULES, "alpaviz.core.graph._b", b)
    cycles = list(nx.simple_cycles(_import_graph()))
    assert ["alpaviz.core.graph._a", "alpaviz.core.graph._b"] in [sorted(c) for c in cycles]


def _undocumented(namespace) -> list[str]:
    """Public functions and classes of `namespace`'s __all__, and public methods and properties of those classes, with no docstring."""
    missing = []
    for name in namespace.__all__:
        obj = getattr(namespace, name)
        own_doc = (vars(obj).get("__doc__") or "") if inspect.isclass(obj) else (obj.__doc__ or "")
        generated = inspect.isclass(obj) and own_doc.startswith(f"{obj.__name__}(")  # a dataclass's signature
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and (not own_doc.strip() or generated):
            missing.append(f"{namespace.__name__}.{name}")
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if not attr.startswith("_") and inspect.isfunction(func) and not (func.__doc__ or "").strip():
                missing.append(f"{obj.__qualname__}.{attr}")
    return missing


@pytest.mark.parametrize("facade", ["alpaviz", "alpaviz.core", "alpaviz.widgets"])
def test_every_public_name_says_why_in_a_docstring(facade):
    namespace = importlib.import_module(facade)
    assert _undocumented(namespace) == []


def test_the_docstring_rule_sees_an_undocumented_method():
    class Documented:
        """A public class."""

        def bare(self):
            return 1

    namespace = types.SimpleNamespace(__name__="planted", __all__=["Documented"], Documented=Documented)
    assert _undocumented(namespace) == ["test_the_docstring_rule_sees_an_undocumented_method.<locals>.Documented.bare"]

"""The package's import graph: no circle, and no private name imported across modules.

The graph is read from the source (module-level and function-level imports alike; imports under
``if TYPE_CHECKING:`` are annotations only and are left out). ``passes/`` and
``decompositions/`` are installed as ``dynexport.passes`` and ``dynexport.decompositions``.
``dynexport/__init__.py`` gathers the public API and is no stage: imports of it are left out.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "dynexport": ROOT / "dynexport",
    "dynexport.passes": ROOT / "passes",
    "dynexport.decompositions": ROOT / "decompositions",
}


def package_modules() -> dict[str, pathlib.Path]:
    """Module name -> source file, for every module of the installed package."""
    modules = {}
    for prefix, directory in PACKAGE_DIRS.items():
        for path in directory.rglob("*.py"):
            parts = [p for p in path.relative_to(directory).with_suffix("").parts if p != "__init__"]
            modules[".".join([prefix, *parts])] = path
    return modules


def _is_package(modules: dict[str, pathlib.Path], name: str) -> bool:
    return modules[name].name == "__init__.py"


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, outside ``if TYPE_CHECKING:`` blocks."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(modules: dict[str, pathlib.Path] | None = None) -> tuple[dict[str, set[str]], list[str]]:
    """The modules (by default the package's) with the modules each imports, and every private
    name one module imports from another (``"dynexport.report imports _type_text from
    dynexport.program"``)."""
    modules = package_modules() if modules is None else modules
    graph: dict[str, set[str]] = {name: set() for name in modules if name != "dynexport"}
    private: list[str] = []
    for name in graph:
        tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
        package = name if _is_package(modules, name) else name.rpartition(".")[0]
        for statement in _imports(tree):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            else:
                base = statement.module or ""
                if statement.level:
                    parents = package.split(".")[: len(package.split(".")) - statement.level + 1]
                    base = ".".join([*parents, base]).strip(".")
                targets = []
                for alias in statement.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        targets.append(submodule)
                    else:
                        targets.append(base)
                        if alias.name.startswith("_") and base in modules:
                            private.append(f"{name} imports {alias.name} from {base}")
            graph[name].update(t for t in targets if t in graph and t != name)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_import_graph_has_no_circle():
    graph, _ = import_graph()
    assert cycles(graph) == []


def test_no_private_name_is_imported_across_modules():
    _, private = import_graph()
    assert private == []


def test_the_checks_see_a_circle_through_a_function_level_import_and_a_private_import(tmp_path):
    sources = {
        "pkg/__init__.py": "",
        "pkg/front.py": "from pkg.back import run\n",
        "pkg/back.py": "def run():\n    from pkg import front\n    from .side import _helper\n",
        "pkg/side.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.front import run\n",
    }
    modules = {}
    for relative, text in sources.items():
        path = tmp_path / relative
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        name = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        modules[name] = path
    graph, private = import_graph(modules)
    assert cycles(graph) == [["pkg.back", "pkg.front"]]
    assert private == ["pkg.back imports _helper from pkg.side"]
    assert graph["pkg.side"] == set()  # annotations only


def test_the_package_graph_holds_the_stages():
    graph, _ = import_graph()
    assert "dynexport.program" in graph["dynexport.api"]
    assert "dynexport.passes.onnx" in graph["dynexport.api"]


if __name__ == "__main__":
    graph, private = import_graph()
    for component in cycles(graph):
        print("cycle:", " <-> ".join(component))
    for line in private:
        print("private:", line)

"""The layout's rules, read from the source with ast: libraries below, commands above.

Every project module's imports (inside functions too, relative ones resolved) make a graph of
the project's modules, named as installed (pyproject's package-dir: backends/ is odeattn.backends).
"""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND_LAYER = ("odeattn.__main__", "odeattn.cli", "odeattn.commands")  # __main__: `python -m odeattn`
LIBRARIES = ("ode_ref", "odeattn.backends", "odeattn.conformance", "odeattn.export")
MAX_LINES = 600


def _folders() -> dict[str, str]:
    """installed package name -> its folder in the repository, from pyproject.toml."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: name.replace(".", "/") for name in tool["packages"]}
    for name, folder in tool["package-dir"].items():  # a package and the packages under it
        for package in folders:
            if package == name or package.startswith(name + "."):
                folders[package] = folder + package[len(name):].replace(".", "/")
    return folders


def _modules() -> dict[str, Path]:
    """Every project module's installed name -> its file."""
    modules = {}
    for package, folder in _folders().items():
        for file in sorted((ROOT / folder).glob("*.py")):
            modules[package if file.stem == "__init__" else f"{package}.{file.stem}"] = file
    return modules


MODULES = _modules()


def _imports(name: str, file: Path) -> set[str]:
    """The project modules `name` imports, anywhere in its file."""
    package = name if file.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            # `from a import b` imports the module a.b if there is one, else a name of a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` of a non-module: the nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, file) for name, file in MODULES.items()}


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path(graph, start: str, within: set[str]) -> list[str]:
    """One import cycle through start inside a component, as a list of modules (start repeated)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & within):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return [start]


def _relative(name: str) -> str:
    return MODULES[name].relative_to(ROOT).as_posix()


def test_the_scan_finds_every_package_under_its_installed_name():
    assert {"ode_ref.block", "odeattn.backends.torch.block", "odeattn.conformance.adapters", "odeattn.export.block",
            "odeattn.cli", "odeattn.commands.args"} <= set(MODULES)
    assert "odeattn.conformance.cases" in GRAPH["odeattn.conformance.adapters"]  # `from .cases import ...`


def test_no_import_cycle_among_the_project_modules():
    cycles = _cycles(GRAPH)
    report = [f"{len(c)} modules: {', '.join(c)}; e.g. {' -> '.join(_path(GRAPH, c[0], set(c)))}" for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(report)


def test_only_the_command_layer_imports_the_command_layer():
    wrong = sorted(f"{_relative(name)} imports {target}" for name, targets in GRAPH.items()
                   if not _within(name, COMMAND_LAYER) for target in targets if _within(target, COMMAND_LAYER))
    assert not wrong, "\n".join(wrong)


def test_the_argument_helpers_import_nothing_of_the_project():
    assert GRAPH["odeattn.commands.args"] == set()


def _imports_argparse(file: Path) -> bool:
    """An `import argparse`, `from argparse import ...` or `__import__("argparse")` anywhere in file."""
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import) and any(a.name.partition(".")[0] == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").partition(".")[0] == "argparse":
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "argparse"):
            return True
    return False


def test_no_library_module_imports_argparse():
    wrong = sorted(_relative(n) for n, file in MODULES.items() if _within(n, LIBRARIES) and _imports_argparse(file))
    assert not wrong, wrong


def test_argparse_stays_in_the_command_layer():
    wrong = sorted(_relative(n) for n, file in MODULES.items() if not _within(n, COMMAND_LAYER) and _imports_argparse(file))
    assert not wrong, wrong


def test_no_source_file_over_600_lines():
    lengths = {_relative(n): len(file.read_text().splitlines()) for n, file in MODULES.items()}
    wrong = sorted(f"{path}: {lines} lines" for path, lines in lengths.items() if lines > MAX_LINES)
    assert not wrong, wrong

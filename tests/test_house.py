"""The layout's rules, read from the source with ast: libraries below, commands above.

Every project module's imports (inside functions too, relative ones resolved) make a graph of
the project's modules, named as installed (pyproject's package-dir: backends/ is odeattn.backends).
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND_LAYER = ("odeattn.__main__", "odeattn.cli", "odeattn.commands")  # __main__: `python -m odeattn`
LIBRARIES = ("ode_ref", "odeattn.backends", "odeattn.conformance", "odeattn.export")
PROJECT = ("ode_ref", "odeattn")  # the top-level import names
MAX_LINES = 600


def _setuptools_by_hand(text: str) -> dict:
    """pyproject.toml's [tool.setuptools] `packages` and `package-dir`, read without a TOML parser
    (Python 3.10 has no tomllib): a list of strings and an inline table of strings."""
    table = text.split("[tool.setuptools]", 1)[1].split("\n[", 1)[0]
    packages = re.search(r"^packages\s*=\s*\[(.*?)\]", table, re.M | re.S).group(1)
    package_dir = re.search(r"^package-dir\s*=\s*\{(.*?)\}", table, re.M | re.S).group(1)
    return {"packages": re.findall(r'"([^"]+)"', packages),
            "package-dir": dict(re.findall(r'"([^"]+)"\s*=\s*"([^"]+)"', package_dir))}


def _setuptools() -> dict:
    """pyproject.toml's [tool.setuptools]: by tomllib (Python 3.11+) or tomli where there is one,
    else the two keys the scan needs, read by hand."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return _setuptools_by_hand(text)
    return tomllib.loads(text)["tool"]["setuptools"]


def _folders() -> dict[str, str]:
    """installed package name -> its folder in the repository, from pyproject.toml."""
    tool = _setuptools()
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
    assert "odeattn.conformance.cases" in GRAPH["odeattn.conformance.adapters.spec"]  # `from ..cases import ...`


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


def _tracked_python() -> list[Path]:
    """Every tracked .py file of the checkout (the packages, benchmarks/, docs/hooks.py, tests/)."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in done.stdout.split("\0") if name and (ROOT / name).is_file()]


def test_pyproject_s_two_keys_read_by_hand_match_tomllib():
    """The fallback of Python 3.10 reads what a TOML parser reads."""
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "pyproject.toml").read_text()
    tool = tomllib.loads(text)["tool"]["setuptools"]
    assert _setuptools_by_hand(text) == {"packages": tool["packages"], "package-dir": tool["package-dir"]}


def test_no_source_file_over_600_lines():
    files = _tracked_python()
    assert {MODULES["odeattn.cli"], ROOT / "docs" / "hooks.py", Path(__file__).resolve()} <= set(files)
    lengths = {f.relative_to(ROOT).as_posix(): len(f.read_text().splitlines()) for f in files}
    wrong = sorted(f"{path}: {lines} lines" for path, lines in lengths.items() if lines > MAX_LINES)
    assert not wrong, wrong


MAX_FUNCTION_LINES = 60  # in conformance/: a function of the suite reads in one screen


def _long_functions(root: Path, limit: int) -> list[str]:
    """'path:line name: N lines' (path from root) for every function, methods and nested ones too,
    under root longer than limit, its decorators left out and its docstring counted."""
    out = []
    for file in sorted(f for f in root.rglob("*.py") if "node_modules" not in f.parts):  # npm's own scripts
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{file.relative_to(root).as_posix()}:{node.lineno} {node.name}: "
                           f"{node.end_lineno - node.lineno + 1} lines")
    return out


def test_the_function_length_check_finds_a_long_method(tmp_path):
    body = "\n".join(f"        x = {k}" for k in range(3))
    (tmp_path / "m.py").write_text(f"class A:\n    def short(self):\n        pass\n\n    def long(self):\n{body}\n")
    found = _long_functions(tmp_path, 3)
    assert len(found) == 1 and found[0].endswith("m.py:5 long: 4 lines")


def test_no_function_in_the_conformance_suite_over_60_lines():
    wrong = _long_functions(ROOT / "conformance", MAX_FUNCTION_LINES)
    assert not wrong, wrong


SUITE = "odeattn.conformance"
# The suite's layers, lowest first, by a module's first part below odeattn.conformance ("": the
# package's own __init__.py, which re-exports the adapter protocol). A module imports from its own
# layer and those below it, never from one above: the cases and their judging (with the golden
# set, its seal and the GenAI check, which read cases only); the wire (frames, lifetimes, the
# compilation counters); the adapters; the runner; the mutation battery and the fuzzer; the
# pytest plug-in.
SUITE_LAYERS = (("cases", "golden", "seal", "genai"), ("wire",), ("adapters",), ("running",), ("mutation", "fuzzing"),
                ("pytest_plugin", ""))


def _suite_layer(name: str) -> int:
    """The index in SUITE_LAYERS of a module of the suite; LookupError for one no layer names."""
    part = name[len(SUITE):].lstrip(".").partition(".")[0]
    found = [i for i, layer in enumerate(SUITE_LAYERS) if part in layer]
    if not found:
        raise LookupError(f"{name}: in no layer of SUITE_LAYERS (tests/test_house.py); add {part!r} to one")
    return found[0]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """'A (layer) imports B (a higher layer)' for every import inside the suite that runs up."""
    def named(module):
        return f"{module} ({'/'.join(SUITE_LAYERS[_suite_layer(module)]) or 'the package'})"

    return sorted(f"{named(name)} imports {named(target)}" for name, targets in graph.items() if _within(name, (SUITE,))
                  for target in targets if _within(target, (SUITE,)) and _suite_layer(target) > _suite_layer(name))


def test_every_module_of_the_suite_is_in_a_layer():
    for name in MODULES:
        if _within(name, (SUITE,)):
            _suite_layer(name)


def test_the_layer_check_finds_an_import_that_runs_up():
    graph = {f"{SUITE}.cases.x": {f"{SUITE}.running.y", "ode_ref"}, f"{SUITE}.running.y": {f"{SUITE}.wire.z"},
             f"{SUITE}.wire.z": set()}
    assert _upward(graph) == [f"{SUITE}.cases.x (cases/golden/seal/genai) imports {SUITE}.running.y (running)"]


def test_no_import_inside_the_conformance_suite_runs_up():
    """Inside functions too: the graph holds every import of a module's file."""
    wrong = _upward(GRAPH)
    assert not wrong, "imports that run up a layer (SUITE_LAYERS):\n" + "\n".join(wrong)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(file: Path) -> list[str]:
    """The underscore-private names of the project that file uses: imported (`from odeattn.x import
    _name`, a private module) or reached as an attribute of a name it imported (`bench._name`)."""
    tree = ast.parse(file.read_text(), str(file))
    bound = {}  # a name the file binds -> the project's dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").partition(".")[0] in PROJECT:
            bound.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
        elif isinstance(node, ast.Import):  # `import a.b` binds a, `import a.b as c` binds c to a.b
            for alias in node.names:
                top = alias.name.partition(".")[0]
                if top in PROJECT:
                    bound[alias.asname or top] = alias.name if alias.asname else top
    found = {name for name in bound.values() if any(_private(part) for part in name.split("."))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.add(".".join([bound[base.id], *chain]))
    return sorted(found)


def test_the_private_name_check_finds_each_form(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("from odeattn.bench import timing, _first_and_warm as warm\nimport odeattn.bench.timing\n"
                      "import ode_ref as R\nfrom odeattn.bench._x import y\n"
                      "timing._burst(); odeattn.bench.timing._rounds(); R._eps; R.__version__; R.ode_block\n")
    assert _private_uses(script) == ["ode_ref._eps", "odeattn.bench._first_and_warm", "odeattn.bench._x.y",
                                     "odeattn.bench.timing._burst", "odeattn.bench.timing._rounds"]


def test_the_benchmark_scripts_use_public_names_only():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    wrong = [f"{f.relative_to(ROOT).as_posix()} uses {name}" for f in scripts for name in _private_uses(f)]
    assert not wrong, "\n".join(wrong)


def test_ruff_finds_nothing():
    """The linter, as configured in pyproject.toml: no unused import or variable, no `# noqa` that
    silences nothing."""
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_suite_s_xdist_groups_share_one_process(tmp_path):
    """pyproject's `--dist loadgroup` sends the tests of one xdist_group to one process, so a costly
    fixture (the main job's parts, the kill table) is built once; with pytest 9.2 and pytest-xdist
    3.8 the groups are silently ignored (constraints.txt pins a pytest that keeps them)."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "pytestmark = pytest.mark.xdist_group('one')\n"
        + "".join(f"def test_{i}(): open(os.path.join({str(tmp_path)!r}, 'w{i}'), 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n"
                  for i in range(6)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           str(tmp_path / "test_grouped.py")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len({(tmp_path / f"w{i}").read_text() for i in range(6)}) == 1


CASE_KINDS = {"block", "decode", "grad", "encoder"}


def _kind_name_tests(tree) -> list:
    """Comparisons of a `.kind` (or a name `kind`) with a case kind's name: `case.kind == "grad"`,
    `kind in ("block", "decode")`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        kinds = any(isinstance(n, ast.Attribute) and n.attr == "kind" or isinstance(n, ast.Name) and n.id == "kind" for n in sides)
        names = {c.value for n in sides for c in ([n] if isinstance(n, ast.Constant) else getattr(n, "elts", []))
                 if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if kinds and names & CASE_KINDS:
            found.append(node.lineno)
    return found


def test_no_suite_module_branches_on_a_case_kind_s_name():
    """A case's kind is one object (conformance/cases/kinds.py): the suite asks it, never tests its name."""
    found = [f"{file.relative_to(ROOT)}:{line}" for name, file in MODULES.items() if name.startswith("odeattn.")
             for line in _kind_name_tests(ast.parse(file.read_text()))]
    assert not found, found


def test_the_kind_name_check_finds_a_name_test():
    assert _kind_name_tests(ast.parse('if case.kind == "grad" or kind in ("block", "decode"): pass')) == [1, 1]


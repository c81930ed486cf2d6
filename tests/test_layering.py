"""Data flows one way, and one package composes the program.

- h3bench.cli (harness/cli/, installed under its own name) is the composition root: it parses the command
  line, and it alone may import adapters/ and reports/ beside harness/; every other module under harness/
  imports neither (the root hands harness the registry and the renderers);
- reports/ (rendering, compare, merge, index) imports no adapters/, and adapters/ no reports/;
- no two modules of the package import each other, even through others;
- no module changes another package's objects when it is imported."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPHILL = ("h3bench.adapters", "h3bench.reports")
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "register"}
# harness/'s folders that install under their own name (pyproject.toml's package-dir)
MAPPED_APART = {"testing": "h3bench.testing", "cli": "h3bench.cli"}
COMPOSITION_ROOT = ROOT / "harness" / "cli"


def _module_name(path: Path, folder: str) -> str:
    parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if folder == "harness" and parts and parts[0] in MAPPED_APART:
        return ".".join([MAPPED_APART[parts[0]], *parts[1:]])
    return ".".join([f"h3bench.{folder}", *parts])


def _sources(folder: str) -> list[Path]:
    """The folder's modules; harness/'s without the composition root."""
    return sorted(p for p in (ROOT / folder).rglob("*.py")
                  if not (folder == "harness" and COMPOSITION_ROOT in p.parents))


def _loaded_by_importing(folder: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under `prefixes` that importing every module of `folder` loads (in a fresh interpreter)."""
    names = [_module_name(p, folder) for p in _sources(folder)]
    code = ("import importlib, json, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_every_harness_module_but_the_cli_imports_neither_adapters_nor_reports():
    assert _loaded_by_importing("harness", UPHILL) == []


def test_importing_every_reports_module_imports_no_adapters():
    assert _loaded_by_importing("reports", ("h3bench.adapters",)) == []


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.JoinedStr)):
            text = "".join(v.value for v in node.args[0].values if isinstance(v, ast.Constant))
            found.append((node.lineno, text))
    return found


def _offenders(folder: str, uphill: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {name}" for path in _sources(folder)
            for line, name in _imported_modules(ast.parse(path.read_text())) if name.startswith(uphill)]


def test_no_harness_module_but_the_cli_imports_adapters_or_reports_even_lazily():
    assert _offenders("harness", UPHILL) == []


def test_reports_and_adapters_import_each_other_nowhere_even_lazily():
    assert _offenders("reports", ("h3bench.adapters",)) == []
    assert _offenders("adapters", ("h3bench.reports",)) == []


def test_the_composition_root_is_where_harness_adapters_and_reports_meet():
    imported = {name for path in COMPOSITION_ROOT.rglob("*.py")
                for _, name in _imported_modules(ast.parse(path.read_text()))}
    for package in ("h3bench.harness", *UPHILL):
        assert any(name.startswith(package) for name in imported), package


def _root(node: ast.AST):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _module_level(tree: ast.Module):
    """The statements that run at import: the module's own, and those under its if/try/with, not in a
    function or class body."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += getattr(node, field, [])


def test_no_module_changes_another_packages_objects_at_import():
    """`other.NAME = ...`, `other.LIST.append(...)`, `setattr(...)` at module level, where `other` is an
    imported name: one package patching another when it happens to be imported."""
    offenders = []
    for folder in ("harness", "adapters", "kernels", "reports", "configs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            imported = {(a.asname or a.name).split(".")[0] for node in tree.body
                        if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
            for node in _module_level(tree):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                bad = [t for t in targets if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in imported]
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    func = node.value.func
                    if isinstance(func, ast.Name) and func.id == "setattr":
                        bad.append(func)
                    elif (isinstance(func, ast.Attribute) and func.attr in MUTATORS
                          and _root(func.value) in imported):
                        bad.append(func)
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for _ in bad[:1]]
    assert offenders == [], offenders


# --- import cycles ------------------------------------------------------------------------------------------

# The package's folders and the import name each installs as (pyproject.toml, [tool.setuptools.package-dir])
PACKAGE_DIRS = {"harness": "h3bench.harness", "adapters": "h3bench.adapters", "kernels": "h3bench.kernels",
                "reports": "h3bench.reports", "configs": "h3bench.configs", "harness/testing": "h3bench.testing"}


def _package_modules() -> dict[str, Path]:
    """Every module of the package by its import name (harness/testing/ as h3bench.testing, as installed)."""
    found = {}
    for folder, package in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[0])):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in found.values():
                continue  # a deeper folder's (harness/testing/) installs under its own name
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def _import_edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line}: every import statement counts, at module level, inside a
    function or under TYPE_CHECKING alike, since each one ties the two modules together (a function-level
    import only defers the tie to its first call). Not counted: a package's __init__ that Python runs on the
    way to a submodule (a package importing its own submodules is no cycle), and a lookup by a name held as
    data (`importlib.import_module(name)`: the registries of adapters, ops, modes and probes name modules
    they find when asked, and a module they name may import the registry)."""
    edges: dict[str, dict[str, int]] = {name: {} for name in modules}

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in map(known, targets):
                if target and target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each set of modules that import each other, through any number of others (a strongly connected
    component of more than one module, Tarjan's), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle_through_a_third_module_and_nothing_else():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_edges_read_every_kind_of_import(tmp_path, monkeypatch):
    """Module-level, function-level, relative and `from package import module` imports are edges."""
    (tmp_path / "harness" / "sub").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "sub" / "__init__.py").write_text("from .two import X\n")
    (tmp_path / "harness" / "one.py").write_text("def f():\n    from h3bench.harness.sub import two\n")
    (tmp_path / "harness" / "sub" / "two.py").write_text("import h3bench.harness.one\nX = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIRS", {"harness": "h3bench.harness"})
    edges = _import_edges(_package_modules())
    assert edges["h3bench.harness.one"] == {"h3bench.harness.sub.two": 2}
    assert edges["h3bench.harness.sub.two"] == {"h3bench.harness.one": 1}
    assert edges["h3bench.harness.sub"] == {"h3bench.harness.sub.two": 1}
    assert _cycles(edges) == [["h3bench.harness.one", "h3bench.harness.sub.two"]]


def test_no_two_modules_of_the_package_import_each_other():
    """A cycle makes the import order matter (a module half-initialised when the other reads it) and the
    two modules one: the run request lives in harness/request.py (not in the runner the child machinery
    imports), the tables' cells in reports/table_spec.py (not in the table the control's section feeds)."""
    edges = _import_edges(_package_modules())
    assert len(edges) > 100 and sum(map(len, edges.values())) > 300  # the scan found the package
    found = [" <-> ".join(cycle) + ": " + "; ".join(f"{a} imports {b} (line {edges[a][b]})" for a in cycle
                                                    for b in cycle if b in edges[a])
             for cycle in _cycles(edges)]
    assert found == [], found

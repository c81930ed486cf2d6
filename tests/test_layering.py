"""Data flows one way, and one package composes the program.

- h3bench.cli (harness/cli/, installed under its own name) is the composition root: it parses the command
  line, and it alone may import adapters/ and reports/ beside harness/; every other module under harness/
  imports neither (the root hands harness the registry and the renderers);
- reports/ (rendering, compare, merge, index) imports no adapters/, and adapters/ no reports/;
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

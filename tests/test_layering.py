"""Data flows one way: harness/ imports neither adapters/ nor reports/ (the program's composition root,
reports/cli.py, hands harness the registry and the renderers), and no module changes another package's
objects when it is imported."""
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


def _harness_modules() -> list[str]:
    return sorted("h3bench.harness." + ".".join(p.relative_to(ROOT / "harness").with_suffix("").parts)
                  .removesuffix(".__init__") for p in (ROOT / "harness").rglob("*.py"))


def test_importing_every_harness_module_imports_neither_adapters_nor_reports():
    code = ("import importlib, json, sys\n"
            f"for name in {_harness_modules()!r}:\n"
            "    importlib.import_module(name.removesuffix('.'))\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({UPHILL!r}))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


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


def test_no_harness_module_imports_adapters_or_reports_even_lazily():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in sorted((ROOT / "harness").rglob("*.py"))
                 for line, name in _imported_modules(ast.parse(path.read_text()))
                 if name.startswith(UPHILL)]
    assert offenders == [], offenders


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

"""The wheel's layout: the five folders install as subpackages of one import name, `h3bench`, and nothing in
them imports a folder by its bare name (which would work from a checkout and fail from the wheel)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "adapters", "kernels", "reports", "configs")
BARE = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})\b", re.M)


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_h3bench():
    found = {"h3bench." + ".".join(init.parent.relative_to(ROOT).parts)
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert sorted(_setuptools()["packages"]) == sorted(found)
    assert _setuptools()["package-dir"] == {f"h3bench.{folder}": folder for folder in FOLDERS}


def test_no_module_imports_a_folder_by_its_bare_name():
    offenders = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
                 for folder in (*FOLDERS, "tests", "tools") for path in (ROOT / folder).rglob("*.py")
                 for text in [path.read_text()] for m in BARE.finditer(text)]
    assert offenders == []


def test_the_console_script_is_the_packaged_cli():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"h3bench": "h3bench.reports.cli:main"}

"""The wheel's layout: the five folders install as subpackages of one import name, `h3bench` (and harness/testing
as `h3bench.testing`), and nothing in them imports a folder by its bare name (which would work from a checkout
and fail from the wheel) or the testing package by its folder's name."""
from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "adapters", "kernels", "reports", "configs")
BARE = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})\b", re.M)


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


# Folders inside the five that install as their own subpackage of h3bench, not under their parent's name:
# harness/testing is `h3bench.testing` (the public test assertion), never `h3bench.harness.testing`.
MAPPED_APART = {"harness/testing": "h3bench.testing"}
# `h3bench.harness.testing` anywhere (an import, importlib's string), or `from h3bench.harness import testing`
APART_IMPORT = re.compile(r"h3bench\.harness\.testing\b|^\s*from\s+h3bench\.harness\s+import\s+\(?[\w\s,]*\btesting\b",
                          re.M)


def _package_name(folder: Path) -> str:
    for path, name in MAPPED_APART.items():
        inside = (ROOT / path).resolve()
        if folder == inside or inside in folder.parents:
            return ".".join([name, *folder.relative_to(inside).parts])
    return "h3bench." + ".".join(folder.relative_to(ROOT).parts)


def test_every_package_folder_is_listed_under_h3bench():
    found = {_package_name(init.parent.resolve())
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert sorted(_setuptools()["packages"]) == sorted(found)
    assert _setuptools()["package-dir"] == {**{f"h3bench.{folder}": folder for folder in FOLDERS},
                                            **{name: path for path, name in MAPPED_APART.items()}}


def test_the_link_script_links_what_the_wheel_maps(tmp_path):
    subprocess.run(["bash", str(ROOT / "tools" / "link_package.sh"), str(tmp_path)], check=True)
    linked = {f"h3bench.{p.name}": p.resolve() for p in (tmp_path / "h3bench").iterdir()}
    assert linked == {name: (ROOT / path).resolve() for name, path in _setuptools()["package-dir"].items()}


def test_nothing_imports_the_testing_package_by_its_folder_name():
    offenders = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
                 for folder in (*FOLDERS, "tests", "tools") for path in (ROOT / folder).rglob("*.py")
                 if path.resolve() != Path(__file__).resolve()
                 for text in [path.read_text()] for m in APART_IMPORT.finditer(text)]
    assert offenders == []


def test_no_module_imports_a_folder_by_its_bare_name():
    offenders = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
                 for folder in (*FOLDERS, "tests", "tools") for path in (ROOT / folder).rglob("*.py")
                 for text in [path.read_text()] for m in BARE.finditer(text)]
    assert offenders == []


def test_the_console_script_is_the_packaged_cli():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"h3bench": "h3bench.reports.cli:main"}

"""The wheel's layout: the five folders install as subpackages of one import name, `h3bench` (harness/testing as
`h3bench.testing` and harness/cli as `h3bench.cli`), every package folder found without a list to keep
(tools/build_backend.py), and nothing in them imports a folder by its bare name (which would work from a
checkout and fail from the wheel) or a package mapped apart by its folder's name."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "adapters", "kernels", "reports", "configs")
BARE = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})\b", re.M)


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


# Folders inside the five that install as their own subpackage of h3bench, not under their parent's name:
# harness/testing is `h3bench.testing` (the public test assertion), never `h3bench.harness.testing`;
# harness/cli is `h3bench.cli` (the command line), never `h3bench.harness.cli`.
MAPPED_APART = {"harness/testing": "h3bench.testing", "harness/cli": "h3bench.cli"}
# `h3bench.harness.testing` anywhere (an import, importlib's string), or `from h3bench.harness import testing`
APART_IMPORT = re.compile(
    "|".join(rf"h3bench\.harness\.{n}\b|^\s*from\s+h3bench\.harness\s+import\s+\(?[\w\s,]*\b{n}\b"
             for n in (Path(path).name for path in MAPPED_APART)), re.M)


def _package_name(folder: Path) -> str:
    for path, name in MAPPED_APART.items():
        inside = (ROOT / path).resolve()
        if folder == inside or inside in folder.parents:
            return ".".join([name, *folder.relative_to(inside).parts])
    return "h3bench." + ".".join(folder.relative_to(ROOT).parts)


def _package_folders() -> dict[str, Path]:
    return {_package_name(init.parent.resolve()): init.parent.resolve()
            for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}


def _build_backend():
    pytest.importorskip("setuptools", reason="the build backend is setuptools'")
    from tools import build_backend
    return build_backend


def test_the_build_finds_every_package_folder_under_h3bench():
    assert "packages" not in _setuptools()   # found by the build backend, not listed
    assert _build_backend().packages(ROOT) == sorted(_package_folders())
    assert _setuptools()["package-dir"] == {**{f"h3bench.{folder}": folder for folder in FOLDERS},
                                            **{name: path for path, name in MAPPED_APART.items()}}


def test_the_wheel_holds_every_module_once_under_h3bench_alone(tmp_path):
    """Built from a copy of the sources (a build leaves build/ behind): each module of the five folders at
    the path its package's name gives, the packages mapped apart under their own names only, and no other
    top-level name."""
    source = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", _build_backend().THIS_FILE):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "evidence"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("h3bench-*.whl")
    held = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")]
    expected = sorted(f"{'/'.join(package.split('.'))}/{module.name}" for package, folder in _package_folders().items()
                      for module in folder.glob("*.py"))
    assert sorted(held) == expected
    assert {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()} == {"h3bench", wheel.name.split("-py")[0]
                                                                             + ".dist-info"}


def test_the_link_script_links_what_the_wheel_maps(tmp_path):
    subprocess.run(["bash", str(ROOT / "tools" / "link_package.sh"), str(tmp_path)], check=True)
    linked = {f"h3bench.{p.name}": p.resolve() for p in (tmp_path / "h3bench").iterdir()}
    assert linked == {name: (ROOT / path).resolve() for name, path in _setuptools()["package-dir"].items()}


def test_nothing_imports_a_package_mapped_apart_by_its_folder_name():
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
    assert project["scripts"] == {"h3bench": "h3bench.cli:main"}

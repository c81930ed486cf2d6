"""h3bench's build backend: setuptools', with the package list found instead of written in pyproject.toml.

Every folder with an `__init__.py` under a folder that `[tool.setuptools.package-dir]` maps is a package,
named from its mapping (harness/ops -> h3bench.harness.ops), so a new op's adapters folder installs without
a line anywhere. A folder mapped apart (harness/testing -> h3bench.testing, harness/cli -> h3bench.cli) is
listed under its own name only: the wheel holds it once. setuptools' own discovery cannot do this: it names
a package after its folder, and the five folders install under one import name.

pyproject.toml names this module (`build-backend`, `backend-path = ["tools"]`); the source archive carries
it, since a wheel built from the archive needs it too.
"""
from __future__ import annotations

from pathlib import Path

from setuptools import build_meta
from setuptools.command.sdist import sdist

try:
    import tomllib
except ImportError:  # Python 3.10: setuptools brings tomli
    import tomli as tomllib

THIS_FILE = "tools/build_backend.py"


def package_dirs(root: Path) -> dict[str, str]:
    """pyproject.toml's `[tool.setuptools.package-dir]`: import name -> folder."""
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def packages(root: Path) -> list[str]:
    """Every package under the mapped folders, each under the name of the deepest mapping that holds it."""
    mapping = {name: (root / folder).resolve() for name, folder in package_dirs(root).items()}
    found = []
    for name, base in mapping.items():
        for init in base.rglob("__init__.py"):
            folder = init.parent.resolve()
            owner = max((b for b in mapping.values() if b == folder or b in folder.parents), key=lambda b: len(b.parts))
            if owner == base:
                found.append(".".join([name, *folder.relative_to(base).parts]))
    return sorted(found)


class _Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, [*files, THIS_FILE])


class _Backend(build_meta._BuildMetaBackend):
    def run_setup(self, setup_script: str = "setup.py") -> None:
        from setuptools import setup

        setup(packages=packages(Path.cwd()), cmdclass={"sdist": _Sdist})


_BACKEND = _Backend()
get_requires_for_build_wheel = _BACKEND.get_requires_for_build_wheel
get_requires_for_build_sdist = _BACKEND.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _BACKEND.prepare_metadata_for_build_wheel
build_wheel = _BACKEND.build_wheel
build_sdist = _BACKEND.build_sdist
get_requires_for_build_editable = _BACKEND.get_requires_for_build_editable
prepare_metadata_for_build_editable = _BACKEND.prepare_metadata_for_build_editable
build_editable = _BACKEND.build_editable


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description="Print the packages the wheel of this checkout holds (the build backend's "
                                        "list).").parse_args()
    print("\n".join(packages(Path(__file__).resolve().parents[1])))

"""Every repository path a tracked text file cites exists in the checkout, and the specification the code
cites lives in docs/.

A comment or page that names a file the repository does not hold (a path on one engineer's machine, a
folder beside the clone, a page that was renamed) sends its reader nowhere. Cited here: a token that starts
with one of the repository's top folders (`docs/...`, `harness/...`, `kernels/notes/...`, `tools/...`,
...) or with `shared/` (a folder beside a clone, never part of it, so cited, it fails even where a checkout
has one), and a bare upper-case page name
(`OPERATORS.md`, `NOTES.md`), which must be some tracked file's name. A glob (`tools/bench_*.py`) must match
some file; templates (`configs/<op>/...`) name no single file and are left out, and so are absolute paths (`/tmp/...`: a
machine's, not the repository's), dotted module names (`h3bench.harness.schema`) and a path qualified by a
commit (`db36112's kernels/x.py`, `db36112:kernels/x.py`: that commit's tree, which `git show` reads).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_FOLDERS = (".ci", "adapters", "configs", "docs", "harness", "kernels", "reports", "shared", "tests", "tools")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".html"}
TEXT_NAMES = {"Makefile", "run", "gpu-nightly", ".gitignore"}
# Files whose paths are not this repository's, each with the reason.
NOT_OURS = {
    "reports/evidence/b200/PROVENANCE.md": "names each file's path in the RFC's repository (RL-Align/RL-Kernel)",
    "tests/test_docs.py": "its examples are the citations this test must catch",
}
# Run logs record the machine a run was made on (its /tmp folders, its package paths): output, not citations.
NOT_CITING = ("reports/evidence/logs/",)

# A path token: a top folder, then path characters; not inside a longer path, a URL or a dotted module name.
_PATH = re.compile(r"(?<![\w./~$-])((?:%s)/[\w./<>*{}$-]*)" % "|".join(re.escape(t) for t in TOP_FOLDERS))
_PAGE = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]+\.md)\b")
_TEMPLATE = re.compile(r"[<>{}$]")
_AT_COMMIT = re.compile(r"\b[0-9a-f]{7,40}(?:'s |:)$")


def cited_paths(text: str) -> list[str]:
    """The repository paths (and globs) `text` cites, as written (trailing punctuation dropped), templates
    left out."""
    found = []
    for match in _PATH.finditer(text):
        token = match.group(1).rstrip(".,;:")
        if not _TEMPLATE.search(token) and not _AT_COMMIT.search(text[:match.start()]):
            found.append(token)
    return found


def cited_pages(text: str) -> list[str]:
    return [m.group(1) for m in _PAGE.finditer(text)]


def _exists(path: str) -> bool:
    """A path exists; a glob matches something."""
    return any(REPO.glob(path)) if "*" in path else (REPO / path).exists()


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, so no list of tracked files: {e}")
    return [p for p in out.decode().split("\0") if p]


def _text_files(tracked: list[str]) -> list[str]:
    return [p for p in tracked
            if (Path(p).suffix in TEXT_SUFFIXES or Path(p).name in TEXT_NAMES)
            and p not in NOT_OURS and not p.startswith(NOT_CITING) and (REPO / p).is_file()]


def test_the_scanner_finds_paths_and_leaves_the_rest():
    text = ("see docs/operators.md, norm_modulate; `harness/probes/layout.py` and (kernels/notes/gemm.md).\n"
            "not: configs/<op>/default.toml, /opt/notes/x.md, h3bench.harness.schema, "
            "https://github.com/a/docs/x.md, foo/harness/x.py, db36112's kernels/x.py, db36112:tools/y.py\n"
            "shared/prior-art/README.md and OPERATORS.md")
    assert cited_paths(text) == ["docs/operators.md", "harness/probes/layout.py", "kernels/notes/gemm.md",
                                 "shared/prior-art/README.md"]
    assert cited_paths("the tools (tools/bench_*.py, tools/probe_*.py)") == ["tools/bench_*.py", "tools/probe_*.py"]
    assert [p for p in ("tools/bench_*.py", "tools/probe_*.py") if not _exists(p)] == ["tools/probe_*.py"]
    assert cited_pages(text) == ["OPERATORS.md"]


def test_no_tracked_file_names_the_checkouts_own_absolute_path():
    """A path of the machine a file was written on means nothing on another: none of the checkout's own
    folder or its parent's, whatever machine the test runs on."""
    tracked = _tracked()
    # its parent too, unless that is a folder every machine has (a clone in /tmp: "/tmp/..." is a temp path)
    shared = {Path("/"), Path("/tmp"), Path("/var/tmp"), Path(tempfile.gettempdir()), Path.home()}
    roots = {f"{REPO}/"} | ({f"{REPO.parent}/"} if REPO.parent not in shared else set())
    # the folder as a path's start, not inside another path (/root/out/work/ is no /work/)
    pattern = re.compile("|".join(rf"(?<![\w./-]){re.escape(root)}" for root in roots))
    found = [f"{rel}:{n}" for rel in _text_files(tracked)
             for n, line in enumerate((REPO / rel).read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if pattern.search(line)]
    assert not found, found


def test_every_cited_repository_path_exists():
    tracked = _tracked()
    missing = []
    for rel in _text_files(tracked):
        text = (REPO / rel).read_text(encoding="utf-8", errors="replace")
        for line_no, line in enumerate(text.splitlines(), 1):
            missing += [f"{rel}:{line_no}: {p}" for p in cited_paths(line)
                        if p.startswith("shared/") or not _exists(p)]
    assert not missing, "cited paths the checkout does not hold:\n" + "\n".join(missing)


def test_every_cited_page_name_is_a_tracked_file():
    tracked = _tracked()
    names = {Path(p).name for p in tracked}
    missing = []
    for rel in _text_files(tracked):
        text = (REPO / rel).read_text(encoding="utf-8", errors="replace")
        for line_no, line in enumerate(text.splitlines(), 1):
            missing += [f"{rel}:{line_no}: {p}" for p in cited_pages(line) if p not in names]
    assert not missing, "cited pages no tracked file is named:\n" + "\n".join(missing)


def test_the_specification_is_in_docs():
    for page in ("README.md", "operators.md", "probes.md", "third_party.md"):
        assert (REPO / "docs" / page).is_file(), f"docs/{page} is missing"
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    for page in ("operators.md", "probes.md", "third_party.md"):
        assert f"({page})" in index, f"docs/README.md does not link {page}"

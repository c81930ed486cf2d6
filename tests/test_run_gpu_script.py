"""reports/evidence/run_gpu.sh, the script that makes the committed GPU evidence: what it refuses before any
step runs."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "reports" / "evidence" / "run_gpu.sh"
GIT_ENV = {"GIT_AUTHOR_NAME": "h3bench", "GIT_AUTHOR_EMAIL": "h3bench@localhost",
           "GIT_COMMITTER_NAME": "h3bench", "GIT_COMMITTER_EMAIL": "h3bench@localhost"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env={**os.environ, **GIT_ENV},
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_it_refuses_to_name_a_copys_old_head_for_a_changed_tree(tmp_path):
    """A machine that got a newer tree over its first copy's git state: H3BENCH_COMMIT set to that stale
    HEAD would record the old commit for files that are not it."""
    repo = tmp_path / "copy"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f.py").write_text("old\n")
    _git(repo, "add", "f.py")
    _git(repo, "commit", "-q", "-m", "first copy")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "f.py").write_text("newer tree\n")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT), "stash"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "H3BENCH_COMMIT": head, "OUT": str(out)})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"H3BENCH_COMMIT={head} is this copy's HEAD" in done.stderr
    assert not out.exists()  # no step ran

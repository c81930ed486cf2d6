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


def test_common_with_named_rows_runs_each_op_alone_into_one_folder(tmp_path):
    """`--adapters` names one op's rows, so `common` with H3BENCH_COMMON_ADAPTERS and several ops runs one
    `h3bench run` per op (each op's --out its file in the same folder) and no modes."""
    bin_dir, record, out = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "out"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # records each call instead of running it
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{record}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "H3BENCH_GPU_TAG": "t",
           "H3BENCH_PKG": str(tmp_path / "pkg"), "H3BENCH_COMMON_OPS": "rms_norm,linear",
           "H3BENCH_COMMON_ADAPTERS": "transformer_engine"}
    done = subprocess.run(["bash", str(SCRIPT), "common"], cwd=SCRIPT.parent.parent.parent, capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    calls = record.read_text().splitlines()
    folder = out / "work" / "common_quick_t"
    assert calls == [f"-m h3bench.cli run --op {op} --device cuda --quick --no-render --quiet --force "
                     f"--out {folder / (op + '.json')} --adapters transformer_engine" for op in ("rms_norm", "linear")]
    assert "common ops (rms_norm, rows transformer_engine), quick plan: rc=0" in done.stdout

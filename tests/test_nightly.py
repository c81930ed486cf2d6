"""The nightly GPU job's script (.ci/gpu-nightly), dry-run on the CPU (quick plan, no GPU tests): each op run,
compared with a baseline folder, the summary and the exit code (0 clean, 1 on a failed run or a regression)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OP = "timestep_sinusoid"  # the quickest op: forward only, a few seconds on the CPU


def nightly(out: Path, baseline: Path, ops: str = OP, **env: str) -> tuple[int, str]:
    environ = {**os.environ, "H3BENCH_PYTHON": sys.executable, "H3BENCH_NIGHTLY_DEVICE": "cpu",
               "H3BENCH_NIGHTLY_OPS": ops, "H3BENCH_BASELINE": str(baseline), "H3BENCH_BASELINE_SUFFIX": "_base",
               **env}
    done = subprocess.run([str(ROOT / ".ci" / "gpu-nightly"), str(out)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=600)
    summary = (out / "summary.txt").read_text()
    assert summary.strip() in done.stdout  # the summary file is what it printed
    return done.returncode, summary


def test_nightly_runs_compares_and_fails_on_a_regression(tmp_path):
    base = tmp_path / "baseline"
    base.mkdir()
    code, summary = nightly(tmp_path / "first", base, ops=f"{OP} no_such_op")
    assert code == 1, summary  # the unknown op's run failed
    assert f"{OP}: measured; no baseline (none of {base / f'{OP}_base.json'})" in summary, summary
    assert "no_such_op: run FAILED" in summary
    assert (tmp_path / "first" / f"{OP}.json").is_file() and (tmp_path / "first" / f"{OP}.md").is_file()

    # The first run as the baseline, on "another GPU" (so CPU timing noise is shown, not judged), with a
    # row the new run will not have: a missing row is a regression unless allowed.
    data = json.loads((tmp_path / "first" / f"{OP}.json").read_text())
    data["environment"]["gpu"] = "baseline GPU"
    rows = data["results"]["plain"]
    rows["ghost"] = rows["h3bench_triton"]
    (base / f"{OP}_base.json").write_text(json.dumps(data))
    code, summary = nightly(tmp_path / "second", base)
    assert code == 1 and f"{OP}: REGRESSION" in summary and "nightly: FAILED" in summary, summary
    assert "ghost" in (tmp_path / "second" / f"compare_{OP}.md").read_text()

    # several suffixes: the first file that exists is the baseline (the committed H100 file before an H200 one)
    code, summary = nightly(tmp_path / "third", base, H3BENCH_ALLOW_MISSING_ROWS="1",
                            H3BENCH_BASELINE_SUFFIX="_newer _base")
    assert code == 0 and "nightly: passed" in summary, summary
    assert f"{OP}: measured; no regression against {base / f'{OP}_base.json'}" in summary, summary
    assert re.search(rf"^{OP}: run rc 0 in \d+ s$", summary, re.M), summary  # each run's seconds
    assert re.search(r"^nightly: passed in \d+ s; files in ", summary, re.M), summary  # the job's


def test_nightly_refuses_an_unknown_plan(tmp_path):
    """H3BENCH_NIGHTLY_PLAN is full or quick; anything else stops the job (exit 2) before a test or run."""
    code, summary = nightly(tmp_path / "out", tmp_path, H3BENCH_NIGHTLY_DEVICE="cuda", H3BENCH_NIGHTLY_PLAN="fast",
                            H3BENCH_NIGHTLY_TESTS="0")
    assert code == 2 and "plan fast" in summary and not (tmp_path / "out" / "tests.log").exists()

"""The committed evidence (reports/evidence/), checked for what must hold whatever run made it: every JSON
file validates as `h3bench validate` checks it, no recorded floor fraction is above 1, every verdict a file
shares with the RFC's B200 copy of its op (reports/evidence/b200/) is the RFC's, each of the seven ops has
an evidence file, and the folder's README names every file with its commit and the log of its run.

Nothing here pins a file's rows, counts, latencies or names: refreshing the evidence must not break a test.
The tools that read evidence (tools/targets.py, tools/verdict_table.py) are tested on fixtures
(tests/test_targets.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from h3bench.harness import semantics
from h3bench.harness.schema import RowResult, from_json, load, read_json, to_dict
from h3bench.harness.semantics import floor_fractions
from tools import verdict_table

EVIDENCE = Path(__file__).resolve().parent.parent / "reports" / "evidence"
README = EVIDENCE / "README.md"
B200 = EVIDENCE / "b200"
SEVEN = ("norm_modulate", "timestep_sinusoid", "timestep_mlp", "adaln_projection", "adaln_row_gather",
         "gate_residual", "final_adaln_out")
# One current set: the seven ops with every default row (0.2-0.5 MB each with their renderings, whose HTML
# inlines the PNGs), the two modes files (about 1 MB each), the sweep, the RFC's B200 copies, the logs, an
# older file where it holds rows the current one lacks, and the common ops' quick files with their Markdown
# (7.4 MB with the seven ops on the current harness and three such files). Superseded files leave (git keeps
# them).
MAX_BYTES = 8 * 1000 * 1000
# work sittings, device calls, to-do lists and version narratives have no place in the evidence's text
DIARY = re.compile(r"session ?[0-9]|session[0-9]+-call|call-[0-9]|next +session|\.md,? v[0-9]|logs/(session)"
                   r"|histor(y)/", re.IGNORECASE)

ALL_JSON = sorted(EVIDENCE.rglob("*.json"))
SWEEPS = [p for p in ALL_JSON if semantics.is_sweep(json.loads(p.read_text()))]
RUNS = [p for p in ALL_JSON if p not in SWEEPS and B200 not in p.parents]   # h3bench's own runs
CURRENT = [p for p in RUNS if p.parent == EVIDENCE]                          # not under defects/


def _name(path: Path) -> str:
    return path.relative_to(EVIDENCE).as_posix()


def _readme_line(name: str) -> str:
    lines = [line for line in README.read_text().splitlines() if line.startswith(f"| `{name}`")]
    assert len(lines) == 1, f"README.md's file table has {len(lines)} lines for {name}"
    return lines[0]


@pytest.mark.parametrize("path", ALL_JSON, ids=_name)
def test_every_evidence_file_validates(path):
    """What `h3bench validate` checks: the contract (keys, nesting, types) and the meaning (figures, counts
    within their totals and the recorded plan's, verdicts that follow from their counts)."""
    data = read_json(path)
    problems = semantics.sweep_problems(data) if path in SWEEPS else semantics.problems(from_json(data))
    assert not problems, problems


@pytest.mark.parametrize("path", RUNS + sorted(B200.glob("*.json")), ids=_name)
def test_every_evidence_file_round_trips(path):
    """The schema writes back every key it reads, with its value and nested as the file has them, and in
    h3bench's own files in their order (the RFC's files order a size's keys otherwise)."""
    data = read_json(path)
    written = to_dict(from_json(data))
    assert written == data
    assert B200 in path.parents or json.dumps(written) == json.dumps(data)


@pytest.mark.parametrize("path", RUNS + sorted(B200.glob("*.json")), ids=_name)
def test_no_recorded_floor_fraction_is_above_one(path):
    """A floor bounds every row from below, whichever model made it."""
    evidence = load(path)
    above = [(mode, name, size, key, value) for mode, rows in evidence.measured_modes().items()
             for name, row in rows.items() if isinstance(row, RowResult)
             for size, result in row.accuracy_latency.items() for key, value in floor_fractions(result)
             if value > 1.0]
    assert not above, above


@pytest.mark.parametrize("path", CURRENT, ids=_name)
def test_every_verdict_a_file_shares_with_the_rfc_is_the_rfcs(path):
    ours = load(path)
    prior = B200 / f"{ours.op}.json"
    assert prior.is_file(), f"no B200 copy for {ours.op}"
    found = verdict_table.compared(load(prior), ours)
    assert not found["differ"], found["differ"]


def test_each_of_the_seven_ops_has_an_evidence_file():
    ops = {load(p).op for p in CURRENT}
    assert set(SEVEN) <= ops, f"no evidence file for {sorted(set(SEVEN) - ops)}"
    assert {load(p).op for p in B200.glob("*.json")} == set(SEVEN)


@pytest.mark.parametrize("path", RUNS, ids=_name)
def test_the_readme_names_each_run_with_its_commit_and_log(path):
    evidence = load(path)
    assert evidence.h3bench_commit and evidence.h3bench_commit != "unknown"
    line = _readme_line(_name(path))
    assert f"| {evidence.h3bench_commit} |" in line
    assert re.search(r"`logs/[^`]+`", line), "the README names the log of the run"


@pytest.mark.parametrize("path", SWEEPS, ids=_name)
def test_the_readme_names_each_sweep_with_its_commit_and_log(path):
    line = next((line for line in README.read_text().splitlines() if line.startswith(f"| `{_name(path)}`")), "")
    assert re.search(r"\| [0-9a-f]{7,40} \|", line) and "`logs/" in line, line


def test_every_log_the_readme_names_exists_and_every_log_is_named():
    named = set(re.findall(r"`logs/([^`/]+)`", README.read_text()))
    present = {p.name for p in (EVIDENCE / "logs").iterdir()}
    assert named <= present, named - present
    assert present <= named, f"logs no README line names: {sorted(present - named)}"
    assert not [p for p in (EVIDENCE / "logs").iterdir() if p.is_dir()], "logs/ is flat"


@pytest.mark.parametrize("path", CURRENT, ids=_name)
def test_each_current_run_has_its_rendering(path):
    stem = path.with_suffix("")
    for suffix in (".md", ".html", "_latency.png", "_accuracy.png", "_verdicts.png"):
        assert Path(f"{stem}{suffix}").is_file(), f"{stem.name}{suffix}"


def test_the_folder_stays_under_8_mb():
    files = [p for p in EVIDENCE.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: -p.stat().st_size)[:5]
    assert total < MAX_BYTES, f"{total / 1e6:.2f} MB; biggest: " + ", ".join(
        f"{p.relative_to(EVIDENCE)} {p.stat().st_size / 1e6:.2f} MB" for p in biggest)


@pytest.mark.parametrize("name", ["README.md", "run_gpu.sh", "b200/PROVENANCE.md"])
def test_the_text_says_what_is(name):
    found = [line for line in (EVIDENCE / name).read_text().splitlines() if DIARY.search(line)]
    assert not found, found

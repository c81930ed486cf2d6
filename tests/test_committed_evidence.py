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
# One current set: each run's JSON with its Markdown and the plots the Markdown shows (HTML is rendered on
# demand by `h3bench report`, never committed), the RFC's B200 copies, the logs, an older file where it holds
# rows the current one lacks. Superseded files leave (git keeps them).
MAX_BYTES = 5 * 1000 * 1000
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


@pytest.mark.parametrize("path", RUNS, ids=_name)
def test_each_run_has_its_markdown_and_every_plot_it_shows(path):
    markdown = path.with_suffix(".md")
    assert markdown.is_file(), markdown.name
    shown = re.findall(r"\]\(([^)\s]+\.png)\)", markdown.read_text())
    assert [p for p in shown if not (path.parent / p).is_file()] == []


def test_no_html_is_committed_and_no_plot_is_left_unshown():
    """HTML is the JSON rendered on demand (`h3bench report`); a plot no Markdown or README shows is a
    leftover."""
    assert sorted(_name(p) for p in EVIDENCE.rglob("*.html")) == []
    texts = "\n".join(p.read_text() for p in EVIDENCE.rglob("*.md"))
    assert [_name(p) for p in EVIDENCE.rglob("*.png") if p.name not in texts] == []


def test_the_folder_stays_under_5_mb():
    files = [p for p in EVIDENCE.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: -p.stat().st_size)[:5]
    assert total < MAX_BYTES, f"{total / 1e6:.2f} MB; biggest: " + ", ".join(
        f"{p.relative_to(EVIDENCE)} {p.stat().st_size / 1e6:.2f} MB" for p in biggest)


@pytest.mark.parametrize("name", ["README.md", "run_gpu.sh", "b200/PROVENANCE.md"])
def test_the_text_says_what_is(name):
    found = [line for line in (EVIDENCE / name).read_text().splitlines() if DIARY.search(line)]
    assert not found, found

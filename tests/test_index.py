"""reports/index.py: the one page over several ops' evidence (`h3bench index`, `run --op all`): a line per row
with its verdict and largest-size latencies, unavailable rows and modes with their reasons, text escaped for
Markdown tables and HTML, links relative to the page."""
from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from h3bench.harness import schema
from h3bench.harness.schema import UnavailableMode, UnavailableRow
from h3bench.reports import index
from h3bench.cli import app
from tests.helpers import require_prior_art

REASON = "RuntimeError: a | b\nsecond line <sm_90a>"


def _files(tmp_path):
    """The prior art, and a copy with one row unavailable and a second mode unavailable, in another folder."""
    prior = require_prior_art()
    evidence = schema.load(prior)
    evidence.results["plain"]["liger"] = UnavailableRow(unavailable=REASON)
    evidence.results["vllm"] = UnavailableMode(unavailable="ImportError: no vllm")
    evidence.environment.mode_environment["vllm"] = {}
    other = tmp_path / "runs" / "b.json"
    other.parent.mkdir()
    schema.save(evidence, other)
    return prior, other


def test_rows_carry_verdicts_sizes_and_latencies(tmp_path):
    prior, other = _files(tmp_path)
    rows = index.index_rows([prior, other], tmp_path / "site")
    first = [r for r in rows if r.file.endswith(prior.name)]
    second = [r for r in rows if r.file.endswith("b.json")]
    evidence = schema.load(prior)
    assert [r.row for r in first] == list(evidence.results["plain"])
    size = schema.sizes_of(evidence)[-1]
    for r in first:
        found = evidence.results["plain"][r.row]
        assert r.size == size
        assert r.verdict == ("invariant" if found.batch_invariance.batch_invariant else r.verdict)
        assert r.fwd_us == found.accuracy_latency[size].fwd_us
        assert r.net_us == found.accuracy_latency[size].fwd_bwd_net_us
    assert any(r.verdict.startswith("NOT invariant: ") for r in first)  # the prior art has failing rows
    liger = next(r for r in second if r.row == "liger")
    assert liger.verdict == f"unavailable: {REASON}" and liger.fwd_us is None
    assert any(r.mode == "vllm" and r.verdict == "mode unavailable: ImportError: no vllm" for r in second)
    assert all(r.file == "../runs/b.json" for r in second)  # relative to the page's folder


def test_markdown_keeps_one_table_line_per_row(tmp_path):
    prior, other = _files(tmp_path)
    rows = index.index_rows([prior, other], tmp_path)
    lines = [line for line in index.render_markdown(rows).splitlines() if line.startswith("|")]
    assert len(lines) == len(rows) + 2  # header and rule
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 9 for line in lines)  # 8 cells each, no stray pipes
    liger = next(line for line in lines if "| liger |" in line and "b.json" in line)
    assert "unavailable: RuntimeError: a \\| b second line \\<sm_90a>" in liger  # renders as the reason, one line


def test_html_escapes_reasons_and_links_reports(tmp_path):
    prior, other = _files(tmp_path)
    page = index.render_html(index.index_rows([prior, other], tmp_path))
    assert "&lt;sm_90a&gt;" in page and "<sm_90a>" not in page
    assert 'href="runs/b.html"' in page and 'href="runs/b.json"' in page


def test_index_command_writes_both_pages_and_refuses_non_evidence(tmp_path):
    prior, other = _files(tmp_path)
    result = CliRunner().invoke(app, ["index", str(prior), str(other), "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "site" / "index.md").is_file() and (tmp_path / "site" / "index.html").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(app, ["index", str(bad), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "bad.json" in result.output


def test_a_missing_file_is_one_clean_line(tmp_path):
    missing = tmp_path / "missing.json"
    result = CliRunner().invoke(app, ["index", str(missing), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and result.output == f"error: {missing}: no such file\n", result.output


def test_the_evidence_folder_glob_indexes(tmp_path):
    """`h3bench index reports/evidence/*.json`: the sweep file among them is listed, not refused."""
    from h3bench.reports.index import index_rows
    evidence = Path(__file__).resolve().parents[1] / "reports" / "evidence"
    rows = index_rows(sorted(evidence.glob("*.json")), tmp_path)
    sweeps = [r for r in rows if r.row == "shape sweep"]
    assert len(sweeps) == 1 and sweeps[0].file.endswith("sweep_norm_modulate_h200.json")
    assert {r.op for r in rows} >= {"norm_modulate", "gate_residual", "timestep_mlp"}

"""`h3bench report --csv`: the evidence as one long table (op, mode, row, check, size, figure, value)."""
from __future__ import annotations

import csv

import pandas as pd

from h3bench.harness import schema
from h3bench.harness.schema import UnavailableRow
from h3bench.reports.long_csv import COLUMNS, to_csv
from tests.helpers import require_prior_art


def test_every_figure_is_a_line_and_pandas_reads_it(tmp_path):
    ev = schema.load(require_prior_art())
    ev.results["plain"]["vllm"] = UnavailableRow(unavailable="ImportError: no vllm, here")
    path = tmp_path / "x.csv"
    path.write_text(to_csv(ev))
    table = pd.read_csv(path, keep_default_na=False)
    assert tuple(table.columns) == COLUMNS
    torch_row = table[(table.row == "torch_rms_norm")]
    fwd = torch_row[(torch_row.figure == "fwd_us") & (torch_row["size"].astype(str) == "4097")]
    assert float(fwd.value.iloc[0]) == ev.results["plain"]["torch_rms_norm"].accuracy_latency["4097"].fwd_us
    verdict = table[(table.row == "diffusers") & (table.figure == "batch_invariant")]
    assert verdict.value.astype(int).tolist() == [0]
    sweep = table[(table.row == "torch_rms_norm") & (table.figure == "batch_size_sweep.comparisons")]
    assert sweep.value.astype(int).tolist() == [2256]
    reason = table[(table.row == "vllm") & (table.check == "unavailable")]
    assert reason.value.tolist() == ["ImportError: no vllm, here"]  # a comma inside stays one cell


def test_report_writes_it(invoke, tmp_path):
    result, text = invoke("report", str(require_prior_art()), "--out", str(tmp_path), "--csv", "--quiet")
    assert result.exit_code == 0, text
    rows = list(csv.reader((tmp_path / "norm_modulate_b200.csv").open()))
    assert tuple(rows[0]) == COLUMNS and len(rows) > 100

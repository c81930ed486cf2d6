"""reports/: tables, plots, render_all, compare, merge and the command functions, on the prior-art file."""
from __future__ import annotations

import copy
import dataclasses
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib import image as mpimg
from rich.console import Console

from h3bench.harness import schema
from h3bench.harness.schema import Evidence, RowResult, Spread, SweepFailure, TimingRecord, UnavailableRow
from h3bench.harness import merge as mrg
from h3bench.reports import commands, compare as cmp, plots, render, table
from tests.helpers import require_prior_art

PRIOR_ART = require_prior_art()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REASON = "ImportError: No module named 'vllm._C' <sm_90a> | 'quoted'"


def prior() -> Evidence:
    return schema.load(PRIOR_ART)


def with_unavailable(ev: Evidence) -> Evidence:
    ev.results["plain"]["vllm"] = UnavailableRow(unavailable=REASON)
    return ev


def full_additive() -> Evidence:
    """The prior art with every additive key set, an unavailable row, a failing row and a second mode."""
    ev = prior()
    ev.h3bench_commit, ev.created_utc, ev.command, ev.wall_s = "abc1234", "2025-12-02T14:00:00Z", "h3bench run", 812.5
    ev.config = {"plan": "full"}
    env = ev.environment
    env.device, env.copy_bandwidth_gbps, env.copy_bandwidth_bytes = "cuda:0", 3850.0, 1 << 30
    env.driver, env.host = "580.65", "gpu-node-1"
    env.timing = TimingRecord(sample="synchronized", stream="back-to-back", timer="cuda_events", warmup=20,
                              reps=100, repeats=2, block=20, interleaved="rows round-robin")
    for row in ev.results["plain"].values():
        assert isinstance(row, RowResult)
        row.wall_s, row.probe_wall_s, row.timer = 12.0, {"all_rows": 3.0}, "cuda_event"
        for size, r in row.accuracy_latency.items():
            r.fwd_us_repeat = r.fwd_us * 1.01
            r.fwd_stream_us, r.fwd_stream_us_repeat = r.fwd_us * 0.9, r.fwd_us * 0.91
            r.spread = {"fwd_us": Spread(p10=r.fwd_us * 0.97, p50=r.fwd_us, p90=r.fwd_us * 1.05, n=100),
                        "fwd_stream_us": Spread(p10=r.fwd_us * 0.89, p50=r.fwd_us * 0.9, p90=r.fwd_us * 0.93, n=100)}
            r.fwd_floor_us = int(size) * 5376 * 2 * 2 / 3850e3
            r.fwd_floor_fraction = r.fwd_floor_us / r.fwd_us
            if row.has_backward:
                r.fwd_bwd_net_us = r.fwd_bwd_us * 0.8
                r.fwd_bwd_us_repeat = r.fwd_bwd_us * 0.99
                r.fwd_bwd_net_us_repeat = r.fwd_bwd_net_us * 1.02
                r.fwd_bwd_floor_us = r.fwd_floor_us * 3
                r.fwd_bwd_floor_fraction = r.fwd_bwd_floor_us / r.fwd_bwd_us
                r.fwd_bwd_net_floor_fraction = r.fwd_bwd_floor_us / r.fwd_bwd_net_us
                r.fwd_bwd_net_stream_us = r.fwd_bwd_net_us * 0.7
                r.fwd_bwd_net_stream_floor_fraction = r.fwd_bwd_floor_us / r.fwd_bwd_net_stream_us
    ev.results["plain"]["vllm"] = UnavailableRow(unavailable=REASON, source="vLLM 0.30.0",
                                                 failed_probe="load", wall_s=0.5)
    env.mode_environment["compiled"] = {"torch_compile": True}
    bad = copy.deepcopy(ev.results["plain"]["rl_kernel"])
    bad.batch_invariance.batch_size_sweep.differ = 5
    bad.batch_invariance.batch_size_sweep.first_failures = [SweepFailure(seed=3, batch=17, position=8, row=259)]
    bad.batch_invariance.batch_invariant = False
    ev.results["compiled"] = {"rl_kernel": bad}
    return schema.from_json(schema.to_dict(ev))  # must still be a valid file


def numbers(ev: Evidence) -> list[str]:
    """Every measured number as the report displays it, formatted here independently of reports.fmt."""
    out = []
    for rows in ev.results.values():
        for row in rows.values():
            if not isinstance(row, RowResult):
                continue
            for r in row.accuracy_latency.values():
                out.append(f"{r.fwd_rel_err:.2e}")
                out += [f"{v:.2e}" for v in (r.grad_rel_err or {}).values()]
                out += [f"{v:.1f}" for v in (r.fwd_us, r.fwd_bwd_us, r.fwd_bwd_net_us, r.fwd_stream_us,
                                             r.fwd_bwd_net_stream_us, r.fwd_us_repeat) if v is not None]
                # a fraction above 1 (this file's copy floors are below some rows) is never a percentage
                out += [f"{v * 100:.0f}%" if v <= 1 else "beat floor"
                        for v in (r.fwd_floor_fraction, r.fwd_bwd_floor_fraction, r.fwd_bwd_net_floor_fraction,
                                  r.fwd_bwd_net_stream_floor_fraction) if v is not None]
                out += [f"{s.p10:.1f}–{s.p90:.1f}" for s in (r.spread or {}).values()]
    return out


class Tables(HTMLParser):
    """Collects the text of every <td>/<th> per <tr>, and every <img src>/<link>/<script>."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.srcs: list[str] = []
        self.external: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.srcs.append(attrs.get("src", ""))
        if tag in ("link", "script") or any(str(v).startswith(("http:", "https:", "//")) for v in attrs.values()):
            self.external.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(html_text: str) -> Tables:
    parser = Tables()
    parser.feed(html_text)
    return parser


# --- tables -------------------------------------------------------------------------------------------

def test_frame_has_one_row_per_mode_and_implementation():
    ev = full_additive()
    frame = table.build_table(ev)
    assert list(zip(frame["mode"], frame["implementation"])) == [
        (m, n) for m, rows in ev.results.items() for n in rows]
    rl = frame[(frame["mode"] == "plain") & (frame["implementation"] == "rl_kernel")].iloc[0]
    assert rl["32768/grad_sc_err"] == ev.results["plain"]["rl_kernel"].accuracy_latency["32768"].grad_rel_err["sc"]
    assert rl["4097/fwd_bwd_net_floor_fraction"] > 0
    assert frame[frame["implementation"] == "vllm"].iloc[0]["reason"] == REASON
    # The prior art has no net times or floors: no such columns.
    assert not [c for c in table.build_table(prior()).columns if "floor" in c or "net" in c]


def test_markdown_prior_art_has_every_row_reason_and_number():
    ev = with_unavailable(prior())
    md = table.render_markdown(ev)
    for name in ev.results["plain"]:
        assert f"| {name} |" in md
    assert REASON.replace("|", "\\|").replace("<", "\\<") in md  # Markdown escapes: renders as REASON
    for number in numbers(ev):
        assert number in md, number
    for text in ("norm_modulate", "NVIDIA B200", "2.13.0+cu130", "copy bandwidth**: not measured",
                 "quick**: no", "ee83dec6bed474647ad11e99f038a3c02fd75183"):
        assert text in md


def _row(tables: Tables, title_first_cell: str, header_contains: str) -> list[list[str]]:
    """The body rows of the first table whose header row contains `header_contains`."""
    for i, row in enumerate(tables.rows):
        if row and row[0] == title_first_cell and header_contains in row:
            body = []
            for r in tables.rows[i + 1:]:
                if not r or r[0] == title_first_cell or (len(r) == 1):
                    break
                body.append(r)
            return body
    raise AssertionError(f"no table with header {header_contains!r}")


def test_html_prior_art_cells_hold_every_row_and_number():
    ev = with_unavailable(prior())
    parsed = parse(table.render_html(ev))
    assert not parsed.external
    cells = {c for row in parsed.rows for c in row}
    for name in ev.results["plain"]:
        assert name in cells
    assert REASON in cells  # escaped on the way in, unescaped by the parser: the same text
    accuracy = {r[0]: r[1:] for r in _row(parsed, "implementation", "grad sc")}
    for name, row in ev.results["plain"].items():
        if not isinstance(row, RowResult):
            continue
        expected = []
        for size in ("4097", "32768"):
            r = row.accuracy_latency[size]
            grads = r.grad_rel_err or {}
            expected += [f"{r.fwd_rel_err:.2e}"] + [f"{grads[g]:.2e}" if g in grads else "—"
                                                     for g in ("x", "w", "sh", "sc")]
        assert accuracy[name] == expected, name
    # the latency tables: one line per implementation and figure, the prior art's figure third
    latency = [r[:3] for r in parsed.rows if r and r[0] in ev.results["plain"] and len(r) == 11]
    for name, row in ev.results["plain"].items():
        if isinstance(row, RowResult):
            for size in ("4097", "32768"):
                r = row.accuracy_latency[size]
                assert [name, "fwd", f"{r.fwd_us:.1f}"] in latency, name
                if r.fwd_bwd_us is not None:
                    assert [name, "fwd+bwd", f"{r.fwd_bwd_us:.1f}"] in latency, name
    meta = {r[0]: r[1] for r in parsed.rows if len(r) == 2}
    assert meta["GPU"] == "NVIDIA B200 (sm 10.0)" and meta["torch"] == "2.13.0+cu130"
    assert meta["copy bandwidth"] == "not measured" and meta["quick"].startswith("no")
    assert meta["rl_kernel commit"].startswith("ee83dec6")


def test_html_full_additive_shows_floors_net_and_modes():
    ev = full_additive()
    parsed = parse(table.render_html(ev))
    cells = {c for row in parsed.rows for c in row}
    for number in numbers(ev):
        assert number in cells, number
    assert {"synchronized µs", "stream µs", "p10–p90", "repeat µs", "floor µs", "% of floor (sync)",
            "% of floor (stream)", "fwd", "fwd+bwd", "fwd+bwd net"} <= cells
    assert any(c.startswith("timing") for c in cells) or "timing" in {r[0] for r in parsed.rows if r}
    meta = {r[0]: r[1] for r in parsed.rows if len(r) == 2}
    assert meta["copy bandwidth"] == "3850 GB/s" and meta["h3bench commit"] == "abc1234"
    assert "load" in cells and "vLLM 0.30.0" in cells
    # The failing compiled row names its failed check with the count and the first failure.
    assert any(c.startswith("sweep: 5/2256 comparisons differ, first at seed 3, batch 17, position 8, row 259") for c in cells)


@pytest.mark.parametrize("breaks, label", [
    (lambda bi: setattr(bi.all_rows["257"], "fwd_differ", 3), "all_rows fwd: 3/7107 rows differ"),
    (lambda bi: setattr(bi.all_rows["64"], "rowgrad_differ", 1), "all_rows rowgrad: 1/7107 rows differ"),
    (lambda bi: setattr(bi, "params_repeatable", False), "params not repeatable"),
    (lambda bi: setattr(bi.full_vs_sub_batches, "rowgrad_differ", 2), "full_vs_sub: fwd 0, rowgrad 2 of 2124"),
    (lambda bi: setattr(bi.batch_size_sweep, "differ", 4), "sweep: 4/2256 comparisons differ"),
])
def test_failed_check_is_named(breaks, label):
    ev = prior()
    bi = ev.results["plain"]["rl_kernel"].batch_invariance
    breaks(bi)
    bi.batch_invariant = False
    frame = table.build_table(ev)
    failed = frame[frame["implementation"] == "rl_kernel"].iloc[0]["failed_checks"]
    assert failed.startswith(label)
    assert frame[frame["implementation"] == "torch_rms_norm"].iloc[0]["failed_checks"] == ""


# --- plots and render_all -------------------------------------------------------------------------------

def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 200 and height > 100
    assert data[25] == 3  # colour type 3: a palette (reports/plots.py), not RGBA at four bytes a pixel
    assert mpimg.imread(path).shape[:2] == (height, width)  # decodes fully


@pytest.mark.parametrize("make", [prior, full_additive])
def test_plots_are_valid_pngs(make, tmp_path):
    ev = make()
    for draw in (plots.plot_latency, plots.plot_accuracy, plots.plot_verdicts):
        _assert_png(draw(ev, tmp_path / f"{draw.__name__}.png"))


def test_plots_of_a_file_with_only_unavailable_rows(tmp_path):
    ev = prior()
    ev.results["plain"] = {"x": UnavailableRow(unavailable="RuntimeError: no GPU")}
    for draw in (plots.plot_latency, plots.plot_accuracy, plots.plot_verdicts):
        _assert_png(draw(ev, tmp_path / f"{draw.__name__}.png"))


@pytest.mark.parametrize("make", [prior, full_additive])
def test_render_all_writes_five_files(make, tmp_path):
    src = tmp_path / "in" / "ev.json"
    schema.save(make(), src)
    paths = render.render_all(src)
    assert [p.name for p in paths] == ["ev.md", "ev.html", "ev_latency.png", "ev_accuracy.png", "ev_verdicts.png"]
    assert all(p.parent == src.parent for p in paths)
    for p in paths[2:]:
        _assert_png(p)
    parsed = parse(paths[1].read_text())
    assert len(parsed.srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in parsed.srcs)
    assert "ev_latency.png" in paths[0].read_text()
    out = render.render_all(src, tmp_path / "elsewhere")
    assert all(p.parent == tmp_path / "elsewhere" for p in out)


def test_render_all_on_the_prior_art_itself(tmp_path):
    paths = render.render_all(PRIOR_ART, tmp_path)
    assert paths[0].name == "norm_modulate_b200.md" and len(paths) == 5


# --- compare ------------------------------------------------------------------------------------------

def kinds(comparison: cmp.Comparison) -> list[tuple[str, str]]:
    return [(r.row, r.kind) for r in comparison.regressions]


def test_compare_no_change_has_no_regression(tmp_path):
    comparison = cmp.compare(prior(), prior())
    assert comparison.regressions == [] and not comparison.has_regression
    assert all(q.ratio == 1.0 for c in comparison.rows for q in c.latency + c.errors)
    assert len(comparison.rows) == 7 and all(c.status == "compared" for c in comparison.rows)
    console = Console(file=open(tmp_path / "out.txt", "w"), width=160)
    assert commands.compare_files(PRIOR_ART, PRIOR_ART, console=console) == 0


@pytest.mark.parametrize("verdict", ["batch_invariant", "params_repeatable"])
def test_compare_verdict_lost_is_a_regression(verdict):
    new = prior()
    setattr(new.results["plain"]["rl_kernel"].batch_invariance, verdict, False)
    comparison = cmp.compare(prior(), new)
    assert kinds(comparison) == [("rl_kernel", "verdict")]
    assert verdict in comparison.regressions[0].message


def test_compare_refuses_two_ops(tmp_path):
    other = prior()
    other.op = "gate_residual"
    with pytest.raises(ValueError, match="op differs"):
        cmp.compare(prior(), other)
    path = schema.save(other, tmp_path / "other.json")
    from typer.testing import CliRunner
    from h3bench.cli import app
    result = CliRunner().invoke(app, ["compare", str(PRIOR_ART), str(path)])
    assert result.exit_code == 2 and "op differs" in result.output


def test_compare_verdict_gained_is_a_flip_not_a_regression():
    new = prior()
    new.results["plain"]["diffusers"].batch_invariance.batch_invariant = True
    comparison = cmp.compare(prior(), new)
    assert comparison.regressions == []
    flips = [f for c in comparison.rows for f in c.flips]
    assert flips == [cmp.VerdictFlip("batch_invariant", False, True, regression=False)]


def test_compare_row_became_unavailable_or_missing():
    new = prior()
    new.results["plain"]["liger"] = UnavailableRow(unavailable="ImportError: no liger")
    del new.results["plain"]["sglang"]
    new.results["plain"]["brand_new"] = copy.deepcopy(new.results["plain"]["rl_kernel"])
    comparison = cmp.compare(prior(), new)
    assert kinds(comparison) == [("liger", "unavailable"), ("sglang", "missing")]
    assert "no liger" in comparison.regressions[0].message
    assert [c.row for c in comparison.new_rows] == ["brand_new"]
    assert {c.row for c in comparison.lost_rows} == {"liger", "sglang"}
    relaxed = cmp.compare(prior(), new, cmp.Thresholds(allow_missing_rows=True))
    assert kinds(relaxed) == [("liger", "unavailable")]


def test_report_counts_skipped_rows_apart_from_unavailable_ones():
    from h3bench.reports.table import mode_summary
    ev = prior()
    ev.results["plain"]["liger"] = UnavailableRow(unavailable="ImportError: no liger")
    ev.results["plain"]["sglang"] = UnavailableRow(unavailable="skipped on CPU: name it to run it")
    assert mode_summary(ev, "plain").endswith("; 1 unavailable; 1 skipped.")


def test_compare_rows_that_never_ran_in_one_file_or_were_skipped_by_choice_are_no_regression():
    """A narrower run against a full one: a row unavailable or skipped in the old file and absent from
    the new never ran in either; a measured row skipped by choice in the new file (a CPU runs it only when
    named) was left out, not lost."""
    old, new = prior(), prior()
    old.results["plain"]["liger"] = UnavailableRow(unavailable="ImportError: no liger")
    old.results["plain"]["sglang"] = UnavailableRow(unavailable="skipped on CPU: costly; name it to run it")
    del new.results["plain"]["liger"], new.results["plain"]["sglang"]
    new.results["plain"]["rl_kernel"] = UnavailableRow(unavailable="skipped on CPU: name it to run it")
    comparison = cmp.compare(old, new)
    assert comparison.regressions == [], comparison.regressions
    statuses = {c.row: c.status for c in comparison.rows}
    assert statuses["liger"] == statuses["sglang"] == "not_run" and statuses["rl_kernel"] == "skipped"
    new.results["plain"]["rl_kernel"] = UnavailableRow(unavailable="RuntimeError: broke")
    assert kinds(cmp.compare(old, new)) == [("rl_kernel", "unavailable")]


@pytest.mark.parametrize("factor, regressed", [(1.6, True), (1.4, False)])
def test_compare_error_growth_against_the_factor(factor, regressed):
    new = prior()
    r = new.results["plain"]["rl_kernel"].accuracy_latency["32768"]
    r.grad_rel_err["sh"] *= factor
    comparison = cmp.compare(prior(), new, cmp.Thresholds(error_factor=1.5))
    assert kinds(comparison) == ([("rl_kernel", "error")] if regressed else [])
    q = next(q for c in comparison.rows for q in c.errors if c.row == "rl_kernel" and q.name == "32768 grad sh")
    assert q.ratio == pytest.approx(factor)


def test_compare_error_factor_default_and_configurable():
    new = prior()
    new.results["plain"]["liger"].accuracy_latency["4097"].fwd_rel_err *= 1.45
    assert cmp.compare(prior(), new).regressions == []  # default 1.5
    assert kinds(cmp.compare(prior(), new, cmp.Thresholds(error_factor=1.2))) == [("liger", "error")]


def test_compare_lost_gradient_is_a_regression():
    new = prior()
    del new.results["plain"]["rl_kernel"].accuracy_latency["4097"].grad_rel_err["sc"]
    assert kinds(cmp.compare(prior(), new)) == [("rl_kernel", "lost_gradient")]


@pytest.mark.parametrize("slowdown, regressed", [(0.15, True), (0.05, False)])
def test_compare_latency_against_the_noise_threshold(slowdown, regressed):
    new = prior()
    new.results["plain"]["torch_rms_norm"].accuracy_latency["32768"].fwd_bwd_us *= 1 + slowdown
    comparison = cmp.compare(prior(), new, cmp.Thresholds(latency_noise=0.10))
    assert kinds(comparison) == ([("torch_rms_norm", "latency")] if regressed else [])
    # Faster is never a regression, however much faster.
    faster = prior()
    faster.results["plain"]["torch_rms_norm"].accuracy_latency["4097"].fwd_us /= 3
    assert cmp.compare(prior(), faster).regressions == []


def test_compare_judges_latency_at_the_largest_common_size_only():
    # Smaller sizes are host-bound and spread run to run (docs/decisions.md, "compare"): shown, not judged.
    new = prior()
    new.results["plain"]["torch_rms_norm"].accuracy_latency["4097"].fwd_us *= 2
    comparison = cmp.compare(prior(), new)
    assert comparison.regressions == []
    shown = [q for c in comparison.rows if c.row == "torch_rms_norm" for q in c.latency if q.name == "4097 fwd_us"]
    assert shown and shown[0].ratio == pytest.approx(2.0)


def test_compare_takes_the_better_of_a_timing_and_its_repeat():
    old, new = prior(), prior()
    result = new.results["plain"]["torch_rms_norm"].accuracy_latency["32768"]
    result.fwd_us_repeat = result.fwd_us
    result.fwd_us *= 1.5  # one slow timing, its repeat as fast as before: noise, not a regression
    assert cmp.compare(old, new).regressions == []
    result.fwd_us_repeat *= 1.5  # both slow: a regression
    assert kinds(cmp.compare(old, new)) == [("torch_rms_norm", "latency")]


def test_compare_latency_uses_the_one_default_constant(monkeypatch):
    new = prior()
    new.results["plain"]["sglang"].accuracy_latency["32768"].fwd_us *= 1 + cmp.LATENCY_NOISE + 0.01
    assert kinds(cmp.compare(prior(), new)) == [("sglang", "latency")]


def test_compare_latency_not_judged_across_gpus():
    new = prior()
    new.environment.gpu = "NVIDIA H200"
    new.results["plain"]["rl_kernel"].accuracy_latency["4097"].fwd_us *= 2
    comparison = cmp.compare(prior(), new)
    assert comparison.regressions == [] and not comparison.latency_compared
    assert any("different GPUs" in n for n in comparison.notes)


def test_compare_files_exit_status_and_markdown(tmp_path):
    new = prior()
    new.results["plain"]["rl_kernel"].batch_invariance.batch_invariant = False
    new.results["plain"]["liger"].accuracy_latency["32768"].fwd_us *= 2
    path = schema.save(new, tmp_path / "new.json")
    out = tmp_path / "console.txt"
    with open(out, "w") as handle:
        status = commands.compare_files(PRIOR_ART, path, markdown_out=tmp_path / "cmp.md",
                                        console=Console(file=handle, width=200))
    assert status == 1
    text = out.read_text()
    assert "2 regression(s)" in text and "[plain] rl_kernel: batch_invariant True -> False" in text
    md = (tmp_path / "cmp.md").read_text()
    assert "## Regressions (2)" in md and "liger 32768 fwd_us 475.6 -> 951.1 µs (2.00x" in md
    assert cmp.render_comparison(cmp.compare(prior(), prior())).count("| compared |") == 7


def test_compare_files_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        commands.compare_files(PRIOR_ART, tmp_path / "nope.json")


# --- merge --------------------------------------------------------------------------------------------

def split(ev: Evidence, names: list[str]) -> tuple[Evidence, Evidence]:
    a, b = copy.deepcopy(ev), copy.deepcopy(ev)
    a.results = {"plain": {n: r for n, r in ev.results["plain"].items() if n in names}}
    b.results = {"plain": {n: r for n, r in ev.results["plain"].items() if n not in names}}
    return a, b


def test_merge_two_partial_runs_restores_every_row(tmp_path):
    a, b = split(prior(), ["diffusers", "liger", "rl_kernel"])
    a.environment.libraries["sglang"] = None  # the run without sglang had it absent
    b.environment.mode_environment["compiled"] = {"torch_compile": True}
    b.results["compiled"] = {"rl_kernel": copy.deepcopy(prior().results["plain"]["rl_kernel"])}
    merged = mrg.merge(a, b)
    assert {n: schema.to_dict(r) for n, r in merged.results["plain"].items()} == \
        {n: schema.to_dict(r) for n, r in prior().results["plain"].items()}
    assert set(merged.environment.mode_environment) == {"plain", "compiled"}
    assert merged.environment.libraries["sglang"] == "0.5.21"
    schema.from_json(schema.to_dict(merged))
    pa, pb = schema.save(a, tmp_path / "a.json"), schema.save(b, tmp_path / "b.json")
    out = commands.merge_files([pa, pb], tmp_path / "merged.json")
    assert len(schema.load(out).results["plain"]) == 7 and "compiled" in schema.load(out).results


def test_merge_same_row_with_same_data_is_kept_once():
    a, b = split(prior(), ["diffusers"])
    b.results["plain"]["diffusers"] = copy.deepcopy(a.results["plain"]["diffusers"])
    assert len(mrg.merge(a, b).results["plain"]) == 7


def _refuse(a: Evidence, b: Evidence, match: str) -> None:
    with pytest.raises(mrg.MergeError, match=match):
        mrg.merge(a, b)


def test_merge_refuses_different_gpu():
    a, b = split(prior(), ["diffusers"])
    b.environment.gpu = "NVIDIA H200"
    _refuse(a, b, r"environment\.gpu differs \('NVIDIA B200' vs 'NVIDIA H200'\)")


def test_merge_refuses_different_torch():
    a, b = split(prior(), ["diffusers"])
    b.environment.torch = "2.12.0+cu128"
    _refuse(a, b, "environment.torch differs")


def test_merge_refuses_different_op_or_plan():
    a, b = split(prior(), ["diffusers"])
    b.op = "other_op"
    _refuse(a, b, "op differs")
    a, b = split(prior(), ["diffusers"])
    b.quick = True
    _refuse(a, b, "quick differs")


def test_merge_refuses_different_mode_environment():
    a, b = split(prior(), ["diffusers"])
    b.environment.mode_environment["plain"] = {"torch_compile": True}
    _refuse(a, b, "mode 'plain' has a different mode_environment")


def test_merge_refuses_conflicting_row():
    a, b = split(prior(), ["diffusers"])
    row = copy.deepcopy(a.results["plain"]["diffusers"])
    row.accuracy_latency["4097"].fwd_us = 99.0
    b.results["plain"]["diffusers"] = row
    _refuse(a, b, r"row plain/diffusers is in both files with different data "
                  r"\(first difference at accuracy_latency\.4097\.fwd_us")


def test_merge_files_errors(tmp_path):
    with pytest.raises(ValueError, match="at least two"):
        commands.merge_files([PRIOR_ART], tmp_path / "m.json")
    with pytest.raises(FileNotFoundError):
        commands.merge_files([PRIOR_ART, tmp_path / "missing.json"], tmp_path / "m.json")
    bad = tmp_path / "bad.json"
    data = json.loads(PRIOR_ART.read_text())
    del data["environment"]["torch"]
    bad.write_text(json.dumps(data))
    with pytest.raises(schema.SchemaError, match="torch"):
        commands.merge_files([PRIOR_ART, bad], tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


# --- report command -----------------------------------------------------------------------------------

def test_report_command(tmp_path, capsys):
    src = schema.save(full_additive(), tmp_path / "run.json")
    paths = commands.report(src, None, quiet=True)
    assert len(paths) == 5 and capsys.readouterr().out == ""
    commands.report(src, tmp_path / "out", quiet=False, console=Console(file=open(tmp_path / "log", "w")))
    log = (tmp_path / "log").read_text()
    assert "plain: 5 of 7 measured implementations batch-invariant" in log and "compiled: 0 of 1" in log
    with pytest.raises(FileNotFoundError):
        commands.report(tmp_path / "absent.json", None, quiet=True)


# --- compare: timing methods and the measured noise ------------------------------------------------------

def timed(ev: Evidence, width: float) -> Evidence:
    """Every latency of `ev` given samples whose p10-p90 spans `width` of the median, and a timing record."""
    ev = copy.deepcopy(ev)
    ev.h3bench_commit = "abc1234"
    ev.environment.timing = TimingRecord(sample="synchronized", stream="back-to-back", timer="cuda_events",
                                         warmup=20, reps=100, repeats=2, block=20, interleaved="rows round-robin")
    for row in ev.results["plain"].values():
        if isinstance(row, RowResult):
            for r in row.accuracy_latency.values():
                r.spread = {k: Spread(p10=v * (1 - width / 2), p50=v, p90=v * (1 + width / 2), n=100)
                            for k in cmp.LATENCY_KEYS if (v := getattr(r, k)) is not None}
    return ev


@pytest.mark.parametrize("width,slowdown,regressed", [
    (0.02, 0.05, True),    # noise 2% -> the 3% minimum: 5% slower is a regression
    (0.02, 0.025, False),
    (0.08, 0.05, False),   # noise 8%: 5% is within it
    (0.08, 0.09, True),
])
def test_compare_latency_threshold_comes_from_the_measured_spread(width, slowdown, regressed):
    old = timed(prior(), width)
    new = copy.deepcopy(old)
    new.results["plain"]["torch_rms_norm"].accuracy_latency["32768"].fwd_us *= 1 + slowdown
    comparison = cmp.compare(old, new)
    assert comparison.latency_compared
    assert kinds(comparison) == ([("torch_rms_norm", "latency")] if regressed else [])
    quantity = next(q for c in comparison.rows if c.row == "torch_rms_norm" for q in c.latency
                    if q.name == "32768 fwd_us")
    assert quantity.allowed == pytest.approx(max(cmp.MIN_LATENCY_NOISE, width))


def test_compare_noise_includes_the_distance_between_two_timings():
    old = timed(prior(), 0.01)
    result = old.results["plain"]["torch_rms_norm"].accuracy_latency["32768"]
    result.fwd_us_repeat = result.fwd_us * 1.12  # the machine drifted 12% between the two timings
    assert cmp.measured_noise(result, "fwd_us") == pytest.approx(0.12)
    assert cmp.measured_noise(prior().results["plain"]["torch_rms_norm"].accuracy_latency["32768"], "fwd_us") is None


def test_compare_refuses_to_judge_latencies_of_different_methods():
    new = timed(prior(), 0.01)
    new.results["plain"]["rl_kernel"].accuracy_latency["32768"].fwd_us *= 3
    comparison = cmp.compare(prior(), new)  # the RFC script's file against h3bench's synchronized record
    assert not comparison.latency_compared and kinds(comparison) == []
    assert any("different methods" in n for n in comparison.notes)
    # an h3bench file from before the timing record held back-to-back samples: not the RFC's method either
    old_h3bench = copy.deepcopy(prior())
    old_h3bench.h3bench_commit = "2e2d53c"
    assert cmp.timing_method(old_h3bench) != cmp.timing_method(prior())
    assert not cmp.compare(old_h3bench, prior()).latency_compared
    assert cmp.compare(prior(), prior()).latency_compared  # two files of the RFC's script: one method


def flushed(ev: Evidence, on: bool) -> Evidence:
    ev.environment.timing = dataclasses.replace(ev.environment.timing, flush_l2=on,
                                                flush_bytes=256 << 20 if on else None)
    return ev


def test_compare_refuses_to_judge_latencies_across_l2_flush_settings():
    old = timed(prior(), 0.01)
    new = flushed(timed(prior(), 0.01), True)
    new.results["plain"]["rl_kernel"].accuracy_latency["32768"].fwd_us *= 3
    comparison = cmp.compare(old, new)
    assert not comparison.latency_compared and kinds(comparison) == []
    assert any("L2 flush settings differ (no L2 flush vs L2 flushed before each sample (268435456 bytes))" in n
               for n in comparison.notes), comparison.notes
    # flushed on both sides: judged; a record without the key flushed nothing, as one that says off
    assert kinds(cmp.compare(flushed(timed(prior(), 0.01), True), new)) == [("rl_kernel", "latency")]
    assert cmp.compare(flushed(timed(prior(), 0.01), False), timed(prior(), 0.01)).latency_compared


def test_compare_judges_the_graph_figures():
    old = timed(prior(), 0.01)
    for row in old.results["plain"].values():
        if isinstance(row, RowResult):
            for r in row.accuracy_latency.values():
                r.fwd_graph_us = r.fwd_us * 0.5
                r.spread["fwd_graph_us"] = Spread(p10=r.fwd_graph_us * 0.99, p50=r.fwd_graph_us,
                                                  p90=r.fwd_graph_us * 1.01, n=100)
    new = copy.deepcopy(old)
    new.results["plain"]["rl_kernel"].accuracy_latency["32768"].fwd_graph_us *= 2
    regressions = cmp.compare(old, new).regressions
    assert [(r.row, r.kind) for r in regressions] == [("rl_kernel", "latency")]
    assert "32768 fwd_graph_us" in regressions[0].message


def with_graph_and_peaks(ev: Evidence) -> Evidence:
    ev.environment.timing = TimingRecord(sample="synchronized", stream="back-to-back", timer="cuda_events",
                                         warmup=20, reps=100, repeats=2, block=20, interleaved="rows round-robin",
                                         graph="cuda_graph replay, per-sample synchronized", flush_l2=True,
                                         flush_bytes=256 << 20, flush_applies_to="each synchronized sample")
    for name, row in ev.results["plain"].items():
        for r in row.accuracy_latency.values():
            r.fwd_graph_us = 12.25
            r.fwd_peak_bytes = 3 << 20
            if name == "liger":
                r.graph_unavailable = {"fwd": "RuntimeError: CUDA error: operation not permitted when stream "
                                              "is capturing"}
                r.fwd_graph_us = None
    return ev


def test_reports_show_graph_figures_peaks_reasons_and_the_flush(tmp_path):
    ev = with_graph_and_peaks(prior())
    assert plots.plot_latency(ev, tmp_path / "latency.png").read_bytes().startswith(PNG_MAGIC)
    md = table.render_markdown(ev)
    assert "graph µs" in md and "12.2" in md and "peak MiB" in md and "| 3.0 |" in md
    assert "not captured" in md and "liger fwd: RuntimeError: CUDA error: operation not permitted" in md
    assert "**L2 flush**: on: a 256.0 MiB buffer zeroed before each synchronized sample" in md
    assert "**graph timing**: *_graph_us: cuda_graph replay, per-sample synchronized" in md
    html = table.render_html(ev)
    assert "graph µs" in html and "peak MiB" in html and "L2 flush" in html
    # a file without them (the prior art, a CPU run) has none of these columns
    plain = table.render_markdown(prior())
    assert "graph µs" not in plain and "peak MiB" not in plain and "L2 flush" not in plain


def test_summary_table_adds_graph_columns_only_where_there_are_graph_figures():
    from h3bench.harness.progress import summary_table

    def header(ev: Evidence) -> str:
        console = Console(width=400, record=True)
        console.print(summary_table(ev))
        return console.export_text()
    assert "fwd gr" in header(with_graph_and_peaks(prior())) and "net gr" in header(with_graph_and_peaks(prior()))
    assert " gr " not in header(prior())


def test_summary_table_prints_reasons_as_text():
    """The terminal summary's caption carries unavailable rows' reasons verbatim: a reason holding
    something that looks like rich markup ("[rank0]", "[inputs]") is not swallowed as a style tag."""
    from h3bench.harness.progress import summary_table
    ev = prior()
    ev.results["plain"]["vllm"] = UnavailableRow(unavailable="RuntimeError: [rank0]: NCCL error [inputs]")
    console = Console(width=400, record=True)
    console.print(summary_table(ev))
    assert "[rank0]: NCCL error [inputs]" in console.export_text()


def test_report_and_merge_commands_exit_codes_and_files(invoke, tmp_path):
    """`h3bench report` writes the renderings and lists them (exit 2 naming a bad file); `h3bench merge`
    joins two partial runs (exit 2 on a conflict, nothing written)."""
    result, text = invoke("report", str(PRIOR_ART), "--out", str(tmp_path / "rendered"))
    assert result.exit_code == 0, text
    listed = [Path(line) for line in result.stdout.splitlines() if line.startswith(str(tmp_path))]  # after a summary
    assert {p.suffix for p in listed} == {".md", ".html", ".png"} and all(p.is_file() for p in listed)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result, text = invoke("report", str(bad))
    assert result.exit_code == 2 and "bad.json" in text

    a, b = split(prior(), ["diffusers", "liger"])
    pa, pb = schema.save(a, tmp_path / "a.json"), schema.save(b, tmp_path / "b.json")
    result, text = invoke("merge", str(pa), str(pb), "-o", str(tmp_path / "merged.json"))
    assert result.exit_code == 0, text
    assert set(schema.load(tmp_path / "merged.json").results["plain"]) == set(prior().results["plain"])
    b.environment.gpu = "NVIDIA H200"
    pb = schema.save(b, tmp_path / "b.json")
    result, text = invoke("merge", str(pa), str(pb), "-o", str(tmp_path / "conflict.json"))
    assert result.exit_code == 2 and "environment.gpu differs" in text
    assert not (tmp_path / "conflict.json").exists()


def test_a_run_of_several_files_gets_an_index_page(tmp_path):
    """The renderer a run calls (reports.render.render_run): each file's pages, and an index page beside
    them when the run wrote more than one file."""
    a, b = split(prior(), ["diffusers"])
    pa, pb = schema.save(a, tmp_path / "a.json"), schema.save(b, tmp_path / "b.json")
    render.render_run([pa])
    assert (tmp_path / "a.md").is_file() and not (tmp_path / "index.md").exists()
    written = render.render_run([pa, pb])
    assert tmp_path / "index.md" in written and tmp_path / "index.html" in written
    assert "(b.json)" in (tmp_path / "index.md").read_text()


def test_compare_two_folders_pairs_files_by_op_and_modes(invoke, tmp_path):
    """`h3bench compare OLD_DIR NEW_DIR`: each evidence file of NEW against OLD's file of its op (same name,
    else same modes, else a shared mode), other JSON ignored, unmatched files listed; exit 1 if a pair
    regressed, 2 on an ambiguous baseline, on a file beside a folder, or with no pair at all."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    schema.save(prior(), old / "norm_modulate_b200.json")
    modes = prior()
    modes.environment.mode_environment["vllm"] = {}
    modes.results["vllm"] = copy.deepcopy(modes.results["plain"])
    schema.save(modes, old / "norm_modulate_modes.json")
    (old / "sweep.json").write_text('{"not": "evidence"}')
    fresh = prior()
    fresh.environment.gpu = "another GPU"  # latency shown, not judged
    schema.save(fresh, new / "norm_modulate.json")
    other = prior()
    other.op = "gate_residual"
    schema.save(other, new / "gate_residual.json")
    result, text = invoke("compare", str(old), str(new), "--markdown", str(tmp_path / "md"))
    assert result.exit_code == 0, text
    assert "norm_modulate_b200.json -> " in text and "norm_modulate_modes.json ->" not in text  # same modes
    assert "not compared: gate_residual.json" in text
    assert (tmp_path / "md" / "compare_norm_modulate.md").is_file()

    del fresh.results["plain"]["liger"]
    schema.save(fresh, new / "norm_modulate.json")
    result, text = invoke("compare", str(old), str(new))
    assert result.exit_code == 1 and "liger" in text

    schema.save(prior(), old / "norm_modulate_again.json")  # two plain-mode baselines of one op
    result, text = invoke("compare", str(old), str(new))
    assert result.exit_code == 2 and "several files of op norm_modulate" in text
    result, text = invoke("compare", str(old), str(new / "norm_modulate.json"))
    assert result.exit_code == 2 and "two evidence files or two folders" in text
    result, text = invoke("compare", str(old), str(tmp_path / "md"))
    assert result.exit_code == 2 and "no evidence file" in text


def test_rendering_a_file_with_recorded_differences_words_where_bits_differ(tmp_path):
    """`h3bench report` words a recorded difference: where bits differ and how many ULP."""
    from h3bench.reports.commands import report

    evidence = Path(__file__).resolve().parents[1] / "reports" / "evidence" / "gate_residual_h100.json"
    report(evidence, tmp_path, quiet=True)
    assert "ULP" in (tmp_path / "gate_residual_h100.md").read_text()

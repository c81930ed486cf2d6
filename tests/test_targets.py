"""tools/targets.py (our rows' targets read from evidence files) and tools/verdict_table.py (two files'
verdicts side by side), on small evidence built here from the contract: each check is met by a file built
to meet it and missed by one edit that must flip it, so a refresh of the committed evidence changes nothing
here."""
from __future__ import annotations

import copy
from typing import Optional

import pytest

from h3bench.harness.schema import Evidence, RowResult, SizeResult, UnavailableRow, load, save
from tests.helpers import require_prior_art
from tools import targets, verdict_table

OURS = targets.OURS
ERRORS = f"every error within {targets.ERROR_FACTOR}x of the best row's"


def _template() -> Evidence:
    return load(require_prior_art())


def size(us: float, err: float = 1e-3, grads: Optional[dict[str, float]] = None, frac: float = 0.9,
         **figures) -> SizeResult:
    """One accuracy size: every latency figure `us` in both timings, every floor fraction `frac`."""
    found = dict(fwd_rel_err=err, fwd_us=us, grad_rel_err=grads, fwd_bwd_us=us, fwd_bwd_net_us=us,
                 fwd_us_repeat=us, fwd_stream_us=us, fwd_bwd_net_stream_us=us, fwd_stream_us_repeat=us,
                 fwd_stream_floor_fraction=frac, fwd_bwd_net_stream_floor_fraction=frac)
    found.update(figures)
    return SizeResult(**found)


def row(sizes: dict[int, SizeResult], invariant: bool = True, params: Optional[bool] = True,
        has_backward: bool = True) -> RowResult:
    """A measured row; its batch-invariance record is the prior art's invariant or non-invariant one."""
    template = _template().results["plain"]["torch_rms_norm" if invariant else "diffusers"]
    bi = copy.deepcopy(template.batch_invariance)
    if invariant:
        bi.params_repeatable = params
    for r in sizes.values():  # the contract: backward keys exactly when the row has a backward
        if not has_backward:
            r.grad_rel_err = r.fwd_bwd_us = r.fwd_bwd_net_us = r.fwd_bwd_net_stream_us = None
            r.fwd_bwd_net_stream_floor_fraction = None
        elif r.grad_rel_err is None:
            r.grad_rel_err = {"x": r.fwd_rel_err}
    return RowResult(source="fixture", has_backward=has_backward, batch_invariance=bi,
                     accuracy_latency={str(s): r for s, r in sizes.items()})


def evidence(op: str, rows: dict, modes: Optional[dict[str, dict]] = None) -> Evidence:
    found = _template()
    found.op = op
    found.results = modes if modes is not None else {"plain": rows}
    plain = found.environment.mode_environment["plain"]
    found.environment.mode_environment = {mode: dict(plain) for mode in found.results}
    return found


def met(found: list[targets.Check]) -> dict[str, Optional[bool]]:
    return {c.target: c.met for c in found}


def by_target(found: list[targets.Check]) -> dict[str, targets.Check]:
    return {c.target: c for c in found}


def memory_file(op: str, **ours_at_largest) -> Evidence:
    """A memory op's file in which our row meets every target: fastest, 90% of the floor, the best errors."""
    grads = {"res": 1e-3, "y": 1e-3, "gate": 1e-3}
    return evidence(op, {
        OURS: row({4097: size(10.0, grads=grads), 32768: size(50.0, grads=grads, **ours_at_largest)}),
        "diffusers": row({4097: size(20.0, grads=grads), 32768: size(100.0, grads=grads)}, invariant=False),
    })


@pytest.mark.parametrize("op", sorted(targets.MEMORY_OPS))
def test_a_memory_op_file_built_to_meet_every_target_meets_them(op):
    found = targets.checks(memory_file(op))
    assert set(met(found).values()) == {True}
    names = set(met(found))
    assert "batch-invariant (every probe count 0)" in names and "parameter gradients repeat bitwise" in names
    assert "fastest row (net fwd+bwd, S = 32768, both timings)" in names and ERRORS in names
    fwd_min, net_min = targets.MEMORY_OPS[op]
    assert any(n.startswith("forward >= ") for n in names) == (fwd_min is not None)
    assert f"net fwd+bwd >= {net_min:.0%} of the floor (S = 32768, stream)" in names


def test_a_floor_fraction_below_the_target_misses_it():
    found = by_target(targets.checks(memory_file("gate_residual", fwd_bwd_net_stream_floor_fraction=0.5)))
    net = found["net fwd+bwd >= 75% of the floor (S = 32768, stream)"]
    assert net.met is False and net.measured.startswith("50.0%")
    assert found["forward >= 85% of the floor (S = 32768, stream)"].met is True


def test_a_row_as_fast_as_ours_in_either_timing_takes_fastest():
    file = memory_file("gate_residual")
    file.results["plain"]["torch_addcmul"] = row({4097: size(5.0), 32768: size(60.0, fwd_bwd_net_stream_us=50.0)})
    fastest = by_target(targets.checks(file))["fastest row (net fwd+bwd, S = 32768, both timings)"]
    assert fastest.met is False and "torch_addcmul 50.0 <= 50.0 (stream)" in fastest.measured
    assert "sync" not in fastest.measured  # only the largest size and only the timing it won are named


def test_an_error_above_the_factor_of_the_best_rows_misses_and_says_where():
    file = memory_file("gate_residual")
    best = file.results["plain"]["diffusers"].accuracy_latency["4097"].grad_rel_err["y"]
    ours = file.results["plain"][OURS].accuracy_latency["4097"]
    ours.grad_rel_err = dict(ours.grad_rel_err, y=targets.ERROR_FACTOR * best)
    assert by_target(targets.checks(file))[ERRORS].met is True  # at the factor: still met
    ours.grad_rel_err = dict(ours.grad_rel_err, y=1.6 * best)
    check = by_target(targets.checks(file))[ERRORS]
    assert check.met is False and "y at 4097" in check.measured


def test_a_row_against_another_reference_is_not_held_against_our_row():
    """norm_modulate's torch_rms_norm row is the norm alone, its error against the norm's float64 reference:
    a smaller error or time there is no better accuracy or speed of the whole op."""
    file = memory_file("gate_residual")
    alone = row({4097: size(5.0, err=1e-5), 32768: size(10.0, err=1e-5)})
    file.results["plain"]["norm_alone"] = alone
    fastest = "fastest row (net fwd+bwd, S = 32768, both timings)"
    found = by_target(targets.checks(file))
    assert found[ERRORS].met is False and found[fastest].met is False  # the op's own reference: it counts
    alone.reference = "rms_norm"
    found = by_target(targets.checks(file))
    assert found[ERRORS].met is True and found[fastest].met is True


def test_our_row_not_invariant_misses_the_invariance_targets():
    file = memory_file("adaln_row_gather")
    sizes = file.results["plain"][OURS].accuracy_latency
    file.results["plain"][OURS] = row({int(s): r for s, r in sizes.items()}, invariant=False)
    found = met(targets.checks(file))
    assert found["batch-invariant (every probe count 0)"] is False
    assert found["parameter gradients repeat bitwise"] is False


def test_no_parameter_gradients_measured_gives_no_repeatability_target():
    file = memory_file("adaln_row_gather")
    file.results["plain"][OURS].batch_invariance.params_repeatable = None
    assert "parameter gradients repeat bitwise" not in met(targets.checks(file))


@pytest.mark.parametrize("gone", ["absent", "unavailable"])
def test_a_file_without_our_measured_row_is_not_measured(gone):
    file = memory_file("gate_residual")
    if gone == "absent":
        del file.results["plain"][OURS]
    else:
        file.results["plain"][OURS] = UnavailableRow(unavailable="ImportError: no triton")
    assert [(c.target, c.met) for c in targets.checks(file)] == [("our row measured", None)]


def gemm_file(op: str = "timestep_mlp", ours_net: float = 120.0, small_fracs=(0.8, 0.75)) -> Evidence:
    """A GEMM op's file: ours and diffusers[plain] (100 us net fwd+bwd at T = 2048); T = 1 and 4 are the
    small sizes whose forward stream floor fractions are `small_fracs`."""
    ours = {1: size(5.0, frac=small_fracs[0]), 4: size(6.0, frac=small_fracs[1]), 2048: size(ours_net)}
    plain = {1: size(9.0), 4: size(9.0), 2048: size(100.0)}
    return evidence(op, {OURS: row(ours), "diffusers[plain]": row(plain, invariant=False)})


def modes_file(op: str = "timestep_mlp", invariant_net: float = 200.0, variant_net: float = 50.0) -> Evidence:
    """A modes file: an invariant mode's row at `invariant_net`, a batch-variant one at `variant_net`."""
    return evidence(op, {}, modes={"plain": {"diffusers[plain]": row({2048: size(100.0)}, invariant=False)},
                                   "vllm": {"diffusers[vllm]": row({2048: size(invariant_net)})},
                                   "sglang": {"diffusers[sglang]": row({2048: size(variant_net)}, invariant=False)}})


def test_a_gemm_file_built_to_meet_every_target_meets_them():
    found = by_target(targets.checks(gemm_file(), modes_file()))
    assert {c.met for c in found.values()} == {True}
    assert found["net fwd+bwd <= 1.3x plain F.linear (T = 2048, sync)"].measured.startswith("1.20x")
    # a faster row that is not batch-invariant does not count against ours
    assert found["faster than every batch-invariant mode's row (T = 2048, net fwd+bwd, sync)"].measured == \
        "faster than all"


def test_the_gemm_targets_flip_one_by_one():
    found = met(targets.checks(gemm_file(ours_net=140.0), modes_file()))
    assert found["net fwd+bwd <= 1.3x plain F.linear (T = 2048, sync)"] is False
    found = by_target(targets.checks(gemm_file(small_fracs=(0.8, 0.6)), modes_file()))
    stream = found["forward streams W at >= 70% of its floor at T <= 8 (stream)"]
    assert stream.met is False and stream.measured == "T=1 80%, T=4 60%"
    found = by_target(targets.checks(gemm_file(), modes_file(invariant_net=110.0)))
    faster = found["faster than every batch-invariant mode's row (T = 2048, net fwd+bwd, sync)"]
    assert faster.met is False and "diffusers[vllm] 110.0" in faster.measured


def test_what_a_gemm_file_cannot_say_is_not_measured():
    file = gemm_file()
    del file.results["plain"]["diffusers[plain]"]
    for size_result in file.results["plain"][OURS].accuracy_latency.values():
        size_result.fwd_stream_floor_fraction = 0.9
    file.results["plain"][OURS].accuracy_latency = {"2048": file.results["plain"][OURS].accuracy_latency["2048"]}
    found = met(targets.checks(file))
    assert found["net fwd+bwd <= 1.3x plain F.linear (T = 2048)"] is None
    assert found["forward streams W at >= 70% of its floor at T <= 8 (stream)"] is None
    assert found["faster than every batch-invariant mode's row"] is None  # no modes file


SINUSOID_LATENCY = "per-sample latency no worse than SGLang's at every T (both timings of it)"


def sinusoid_file(err: float = 5e-8) -> Evidence:
    ours = {1: size(4.0, err=err), 64: size(5.0, err=err)}
    sglang = {1: size(6.0), 64: size(6.0)}
    return evidence("timestep_sinusoid", {OURS: row(ours, params=None, has_backward=False),
                                          "sglang": row(sglang, params=None, has_backward=False)})


def test_the_sinusoid_targets():
    found = by_target(targets.checks(sinusoid_file()))
    assert found[f"error <= {targets.SINUSOID_ERROR:g} at every T"].met is True
    assert found[SINUSOID_LATENCY].met is True and found[SINUSOID_LATENCY].measured == "never slower"
    assert "fastest row (forward, S = 64, both timings)" not in found  # the sinusoid's own latency target
    assert met(targets.checks(sinusoid_file(err=2e-7)))[f"error <= {targets.SINUSOID_ERROR:g} at every T"] is False


def test_ours_slower_than_sglang_in_the_repeat_figure_only_is_slower():
    file = sinusoid_file()
    file.results["plain"][OURS].accuracy_latency["64"].fwd_us_repeat = 7.0
    check = by_target(targets.checks(file))[SINUSOID_LATENCY]
    assert check.met is False and check.measured == "T=64 (repeat): 7.0 > 6.0"


def test_the_sinusoid_without_sglang_is_not_measured():
    file = sinusoid_file()
    del file.results["plain"]["sglang"]
    assert met(targets.checks(file))[SINUSOID_LATENCY] is None


def test_cli_prints_one_table_line_per_check(tmp_path, capsys):
    paths = [save(memory_file("gate_residual"), tmp_path / "gate_residual.json"),
             save(gemm_file(ours_net=140.0), tmp_path / "timestep_mlp.json"),
             save(sinusoid_file(), tmp_path / "timestep_sinusoid.json")]
    modes = save(modes_file(), tmp_path / "timestep_mlp_modes.json")
    found = targets.main([str(p) for p in paths] + ["--modes", str(modes)])
    out = capsys.readouterr().out
    assert out.startswith("| op | target |")
    lines = [line for line in out.splitlines()[2:]]
    assert len(lines) == len(found)
    mark = {True: "| met |", False: "| MISSED |", None: "| not measured |"}
    for line, check in zip(lines, found):
        assert line.startswith(f"| {check.op} | {check.target} |") and line.endswith(mark[check.met])
    assert {c.op for c in found} == {"gate_residual", "timestep_mlp", "timestep_sinusoid"}
    assert False in {c.met for c in found}


def test_verdict_table_sorts_rows_by_what_both_files_say():
    prior = evidence("gate_residual", {"same": row({1: size(1.0)}), "flipped": row({1: size(1.0)}),
                                       "lost": row({1: size(1.0)}, invariant=False),
                                       "prior_only": row({1: size(1.0)})})
    ours = evidence("gate_residual", {"same": row({1: size(2.0)}), "flipped": row({1: size(1.0)}, invariant=False),
                                      "lost": UnavailableRow(unavailable="ImportError: x"),
                                      "ours_only": row({1: size(1.0)})})
    assert verdict_table.compared(prior, ours) == {
        "same": ["plain/same"], "differ": ["plain/flipped"], "unavailable": ["plain/lost"],
        "ours only": ["plain/ours_only"], "prior only": ["plain/prior_only"]}
    text = verdict_table.table(prior, ours, "B200", "H200")
    assert text.startswith("| mode | row | B200 | H200 | same verdict? |")
    ours.environment.gpu = "NVIDIA H100 80GB HBM3"
    assert verdict_table.gpu_label(ours, "h3bench") == "H100 (h3bench)"  # the file's GPU, not a default's
    ours.environment.gpu = None
    ours.environment.device = "cpu:x86_64"
    assert verdict_table.gpu_label(ours, "h3bench") == "cpu:x86_64 (h3bench)"
    assert len([line for line in text.splitlines() if line.startswith("| plain |")]) == 5


# --- tools/eager_vs_graph.py ----------------------------------------------------------------------------

def test_eager_vs_graph_compares_ours_eager_with_the_fastest_other_row_of_our_reference():
    from tools import eager_vs_graph as evg

    partial = row({4097: size(1.0)})
    partial.reference = "rms_norm"  # part of the op: neither computes nor costs what ours does
    file = evidence("gate_residual", {
        OURS: row({4097: size(10.0, fwd_graph_us=5.0, fwd_bwd_net_graph_us=9.0),
                   32768: size(50.0, fwd_graph_us=45.0, fwd_bwd_net_graph_us=30.0)}),
        "diffusers": row({4097: size(20.0), 32768: size(40.0)}, invariant=False),
        "norm_alone": partial})
    found = {(l.size, l.figure): l for l in evg.lines(file)}
    assert set(found) == {("4097", "fwd"), ("4097", "net"), ("32768", "fwd"), ("32768", "net")}
    assert (found[("4097", "fwd")].best, found[("4097", "fwd")].ahead) == ("diffusers", True)
    assert found[("32768", "net")].ahead is False and found[("32768", "net")].best_us == 40.0
    assert found[("4097", "fwd")].host_ratio == 2.0
    text = evg.render(list(found.values()), markdown=False)
    assert "ours behind some row eager in 2 of 4 comparisons: gate_residual 32768 fwd, gate_residual 32768 net" \
        in text
    assert "its graph replay: gate_residual net 1.67x" in text  # 50 / 30 at the largest size; 45 is within 1.25x
    assert evg.lines(evidence("gate_residual", {"diffusers": row({1: size(1.0)})})) == []


def test_eager_vs_graph_takes_one_runs_files_only():
    from tools import eager_vs_graph as evg

    a, b = evidence("gate_residual", {}), evidence("final_adaln_out", {})
    assert evg.one_run([a, b]) is None
    assert "two files of gate_residual" in evg.one_run([a, evidence("gate_residual", {})])
    b.h3bench_commit = "abc1234"
    assert evg.one_run([a, b]).startswith("files of several runs")

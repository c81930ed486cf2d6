"""The probes beyond the RFC's (contention, graph replay, layout, grad set) each catch a fault the RFC's
probes pass.

Each planted implementation is the honest composition with one fault that shows only under one new probe:
a result that changes while a side load runs (contention), a slow path for strided inputs that sums in
another order (layout), a size read from a Python global that a graph keeps from capture time (graph
replay: on the CPU through a capture double, on a GPU through a real CUDA graph), a backward whose dx sums
in another order when the norm's weight is frozen (grad set). The honest rows (the composition, diffusers,
our Triton kernel) are clean under all four; an implementation that rejects non-contiguous inputs, or a
frozen parameter, records the rejection, which is no failure.
"""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F

from h3bench.adapters import builtin_adapters
from h3bench.harness import gate
from h3bench.harness.config import load_config
from h3bench.harness.execute import as_bits
from h3bench.harness.ops import get_op
from h3bench.harness.probes import contention, grad_set, graph_replay, layout
from h3bench.harness.probes.contention import ContentionPlan
from h3bench.harness.probes.grad_set import GradSetPlan
from h3bench.harness.probes.graph_replay import GraphReplayPlan
from h3bench.harness.probes.layout import LayoutPlan
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.side_load import THREAD_PREFIX, SideLoad
from h3bench.harness.progress import summary_table
from h3bench.harness.schema import from_json, to_dict
from h3bench.harness.semantics import problems
from h3bench.reports import verdicts
from h3bench.reports.table import render_markdown
from tests.conftest import DEVICE
from tests.helpers import composition, run_norm_modulate_rows

CPU = torch.device("cpu")
QUICK = load_config("norm_modulate", quick=True)
OP = get_op("norm_modulate")
GRADS = ("x", "w", "sh", "sc")
BUMP = 2 ** -5  # larger than a bf16 ulp: changes the bits of every non-zero element


def honest(x, w, sh, sc, idx):
    return composition(x, w, sh, sc, idx)


def under_side_load(x, w, sh, sc, idx):
    """Reads whether another workload runs beside it (here: a side load's thread) and takes another path."""
    y = composition(x, w, sh, sc, idx)
    racing = any(t.name.startswith(THREAD_PREFIX) for t in threading.enumerate())
    return y + (y * BUMP).detach() if racing else y


def _sequential_bf16_norm(x, w, eps=1e-5):
    total = x[:, 0] * x[:, 0]
    for j in range(1, x.shape[1]):
        total = total + x[:, j] * x[:, j]  # bf16 at every step: another order and rounding than rms_norm's
    return x * torch.rsqrt(total[:, None] / x.shape[1] + eps) * w


def strided_slow_path(x, w, sh, sc, idx):
    """A non-contiguous x (padded rows, column-major) takes a slow path that sums in another order."""
    if x.is_contiguous():
        return composition(x, w, sh, sc, idx)
    y = _sequential_bf16_norm(x, w)
    return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)


def contiguous_only(x, w, sh, sc, idx):
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    return composition(x, w, sh, sc, idx)


EPS = 1e-5


def row_dot(g: torch.Tensor, xhat: torch.Tensor, one_pass: bool) -> torch.Tensor:
    """Per row, sum(g * xhat) over the hidden size: in one float32 pass, or column by column in bf16 (another
    order and rounding: what a cheaper path might do)."""
    if one_pass:
        return (g * xhat).sum(-1, keepdim=True)
    products = (g * xhat).to(torch.bfloat16)
    total = products[:, 0]
    for j in range(1, products.shape[1]):
        total = total + products[:, j]
    return total.float()[:, None]


def norm_dx(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, one_pass: bool) -> torch.Tensor:
    """rms_norm(x) * w's dx from the upstream gradient dy, with row_dot's sum."""
    xf = x.float().contiguous()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    xhat, g = xf * rstd, (dy.float() * w.float()).contiguous()
    return ((g - xhat * row_dot(g, xhat, one_pass) / x.shape[1]) * rstd).to(x.dtype)


class NormWithOwnBackward(torch.autograd.Function):
    """F.rms_norm(x) * w forward; a backward of its own whose dx sums in one float32 pass, or, with
    `cheaper_when_frozen` and the weight's gradient not requested, column by column in bf16."""

    @staticmethod
    def forward(ctx, x, w, cheaper_when_frozen):
        ctx.save_for_backward(x, w)
        ctx.cheaper_when_frozen = cheaper_when_frozen
        return F.rms_norm(x, (x.shape[-1],), w, EPS)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        one_pass = ctx.needs_input_grad[1] or not ctx.cheaper_when_frozen
        dx = norm_dx(x, w, dy, one_pass) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            xf = x.float().contiguous()
            dw = (dy.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).sum(0).to(w.dtype)
        return dx, dw, None


def _modulated(y, sh, sc, idx):
    return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)


def own_backward(x, w, sh, sc, idx):
    return _modulated(NormWithOwnBackward.apply(x, w, False), sh, sc, idx)


def frozen_weight_path(x, w, sh, sc, idx):
    """A backward that takes a cheaper dx path when the norm's weight is frozen (no dw requested)."""
    return _modulated(NormWithOwnBackward.apply(x, w, True), sh, sc, idx)


def needs_every_gradient(x, w, sh, sc, idx):
    """Trains only with every parameter: refuses a frozen one (a forward without gradients runs)."""
    if x.requires_grad and not (w.requires_grad and sh.requires_grad and sc.requires_grad):
        raise ValueError("every parameter must require grad")
    return composition(x, w, sh, sc, idx)


PLANTED = {"under_side_load": under_side_load, "strided_slow_path": strided_slow_path,
           "contiguous_only": contiguous_only, "honest": honest, "own_backward": own_backward,
           "frozen_weight_path": frozen_weight_path, "needs_every_gradient": needs_every_gradient}
FROZEN_SETS = ["frozen w", "frozen sh", "frozen sc", "none requested"]


@pytest.fixture(scope="module")
def quick_rows() -> dict:
    """The planted rows, the composition and diffusers, through the quick plan (every probe) in one run."""
    return run_norm_modulate_rows(PLANTED, [a for a in builtin_adapters("norm_modulate") if a.name == "diffusers"])


def _bi(evidence, name):
    return evidence.results["plain"][name].batch_invariance


@pytest.mark.parametrize("name", ["honest", "diffusers", "own_backward"])
def test_honest_rows_are_clean_under_every_probe(quick_rows, name):
    bi = _bi(quick_rows, name)
    assert bi.batch_invariant is True
    found = bi.beyond_rfc
    assert list(found) == ["contention", "graph_replay", "layout", "grad_set"]  # PROBES' order
    assert found["contention"].invariant is True and found["layout"].invariant is True
    assert found["grad_set"].invariant is True
    assert list(found["grad_set"].cases) == FROZEN_SETS and found["grad_set"].params == ["w", "sh", "sc"]
    assert all(c.rows == QUICK.plan("grad_set").rows and c.tensors == ["grad x"] and c.rejected is None
               for c in found["grad_set"].cases.values())
    assert set(found["layout"].cases) == {"row_offset", "padded_rows", "column_major"}
    assert found["layout"].cases["row_offset"].tensors == ["x", "idx"]
    assert all(c.rejected is None and c.rows == QUICK.plan("layout").rows for c in found["layout"].cases.values())
    assert found["graph_replay"].invariant is None
    assert found["graph_replay"].not_run == graph_replay.not_run_reason(CPU)
    assert gate.what_failed(bi) == []


def test_the_loads_overlap_the_rows_runs(quick_rows):
    record = _bi(quick_rows, "honest").beyond_rfc["contention"]
    plan = QUICK.plan("contention")
    runs = plan.rows + len(plan.sub_batches()) + 1
    assert record.idle.comparisons == 2 * plan.rows and record.idle.params_repeatable is True
    for case in record.loads.values():
        assert case.runs == runs and case.comparisons == 3 * plan.rows
        assert case.iterations >= 1 and case.overlapped >= 1


def test_a_result_that_races_the_side_load_is_caught_by_contention_only(quick_rows):
    bi = _bi(quick_rows, "under_side_load")
    assert bi.batch_invariant is True and bi.params_repeatable is True  # the RFC's probes pass it
    assert bi.beyond_rfc["layout"].invariant is True
    record = bi.beyond_rfc["contention"]
    assert record.invariant is False and record.idle.fwd_differ == 0
    for kind, case in record.loads.items():
        assert case.fwd_differ == case.comparisons  # every row under the load
        assert case.first_difference is not None and case.first_difference.tensor == "y"
    failed = gate.what_failed(bi)
    assert failed and all(line.startswith("contention under the ") for line in failed)
    statuses = {c.name: c.status for c in verdicts.checks(quick_rows.results["plain"]["under_side_load"])}
    assert statuses["contention"] is verdicts.Status.FAIL and statuses["layout"] is verdicts.Status.PASS
    assert statuses["sweep"] is verdicts.Status.PASS


def test_a_strided_slow_path_is_caught_by_layout_only(quick_rows):
    bi = _bi(quick_rows, "strided_slow_path")
    assert bi.batch_invariant is True and bi.beyond_rfc["contention"].invariant is True
    cases = bi.beyond_rfc["layout"].cases
    assert bi.beyond_rfc["layout"].invariant is False
    assert cases["row_offset"].fwd_differ == 0  # a row slice is still contiguous: the fast path
    for name in ("padded_rows", "column_major"):
        assert cases[name].fwd_differ > 0 and cases[name].first_difference is not None
    assert any(line.startswith("layout padded_rows: fwd") for line in gate.what_failed(bi))


def test_a_rejected_layout_is_recorded_not_failed(quick_rows):
    bi = _bi(quick_rows, "contiguous_only")
    cases = bi.beyond_rfc["layout"].cases
    assert cases["padded_rows"].rejected == "rejects padded_rows: ValueError: x must be contiguous"
    assert cases["column_major"].rejected == "rejects column_major: ValueError: x must be contiguous"
    assert (cases["padded_rows"].rows, cases["padded_rows"].fwd_differ) == (0, 0)
    assert cases["row_offset"].rejected is None and cases["row_offset"].rows == QUICK.plan("layout").rows
    assert bi.beyond_rfc["layout"].invariant is True and gate.what_failed(bi) == []
    assert gate.failures(quick_rows, frozenset({"contiguous_only"})) == []


def test_the_file_names_the_failing_probes_and_means_what_it_says(quick_rows):
    evidence = from_json(to_dict(quick_rows))  # the new keys go through the codec
    assert problems(evidence) == []
    lines = gate.failures(evidence, gate.ALL)
    assert any("under_side_load" in line and "contention" in line for line in lines)
    assert any("strided_slow_path" in line and "layout" in line for line in lines)
    assert not any("/honest " in line or "/diffusers " in line for line in lines)
    caption = str(summary_table(evidence).caption)
    assert "not by h3bench's: under_side_load: contention" in caption
    assert "strided_slow_path: layout" in caption
    markdown = render_markdown(evidence)
    assert "Beyond the RFC's probes" in markdown and "rejects padded_rows" in markdown


def test_validate_holds_the_new_flags_to_their_counts(quick_rows):
    evidence = from_json(to_dict(quick_rows))
    evidence.results["plain"]["under_side_load"].batch_invariance.beyond_rfc["contention"].invariant = True
    evidence.results["plain"]["strided_slow_path"].batch_invariance.beyond_rfc["layout"].invariant = True
    evidence.results["plain"]["frozen_weight_path"].batch_invariance.beyond_rfc["grad_set"].invariant = True
    evidence.results["plain"]["honest"].batch_invariance.beyond_rfc["grad_set"].cases["frozen w"].rowgrad_differ = 99
    found = problems(evidence)
    assert any(p.endswith("contention.invariant: True but its counts say False") for p in found)
    assert any(p.endswith("layout.invariant: True but its counts say False") for p in found)
    assert any("frozen_weight_path" in p and p.endswith("grad_set.invariant: True but its counts say False")
               for p in found)
    assert any("grad_set.cases.frozen w: differing rows (0, 99) not within 0..8" in p for p in found)


def test_a_config_without_the_new_tables_leaves_them_out():
    from h3bench.harness.config import build_config

    data = {k: v for k, v in QUICK.to_dict().items() if k not in ("op", "quick", "plans")}
    old = {k: v for k, v in data.items() if k not in ("contention", "graph_replay", "layout", "grad_set")}
    built = build_config("norm_modulate", old, True, "old.toml")
    assert [built.plan(t) for t in ("contention", "graph_replay", "layout", "grad_set")] == [None] * 4
    assert "contention" not in built.to_dict() and "grad_set" not in built.to_dict()
    new = build_config("norm_modulate", data, True, "new.toml")
    assert new.plan("grad_set") == QUICK.plan("grad_set") and new.plan("contention") == QUICK.plan("contention")
    assert list(new.to_dict()) == list(QUICK.to_dict())  # the recorded config's keys in their order


def test_the_side_load_stops_its_thread():
    with SideLoad("compute", CPU, copy_mib=1, matmul_dim=64) as load:
        assert any(t.name == f"{THREAD_PREFIX}: compute" for t in threading.enumerate())
        assert load.iterations >= 1
    assert not any(t.name.startswith(THREAD_PREFIX) for t in threading.enumerate())


# --- our Triton kernel under contention and layout -------------------------------------------------------

def test_our_triton_kernel_is_clean_under_contention_and_layout(device):
    adapter = next(a for a in builtin_adapters("norm_modulate") if a.name == "h3bench_triton")
    params = dataclasses.replace(QUICK.inputs, hidden=16)
    ctx = ProbeContext(op=OP, params=params, fn=adapter.load(device, params).fn, grads=adapter.grads,
                       device=device, reference_variant=OP.name)
    record = contention.contention(ctx, ContentionPlan(rows=2, sub_batch=1, seeds=(3,), copy_mib=4, matmul_dim=128))
    assert record.invariant is True and all(c.overlapped >= 1 for c in record.loads.values())
    laid = layout.layout(ctx, LayoutPlan(rows=2, seeds=(3,), offset_rows=3))
    assert laid.invariant is True
    assert all(c.rows == 2 or c.rejected for c in laid.cases.values())


# --- graph replay ------------------------------------------------------------------------------------------

class ReplayDouble:
    """Stands in for CUDA graph capture on the CPU: warms `step` up eagerly, then "captures" it; a replay runs
    it again with `capturing` set, as a graph replays what was decided on the host at capture time."""

    def __init__(self):
        self.capturing = False

    def __call__(self, step):
        step()  # the warm-up, eager

        def replay():
            self.capturing = True
            try:
                return step()
            finally:
                self.capturing = False
        replay()  # the capture
        return replay


DOUBLE = ReplayDouble()
_STALE: dict[str, int] = {}


def stale_table_size(x, w, sh, sc, idx, capturing=lambda: DOUBLE.capturing):
    """Reads the used table size from the host when eager (a sync a graph cannot hold) and keeps it in a
    Python global for captured calls, which therefore use the size of the capture's inputs."""
    if not capturing():
        _STALE["rows"] = int(idx.max()) + 1
    return composition(x, w, sh, sc, idx.clamp(max=_STALE["rows"] - 1))


REPLAY_PLAN = GraphReplayPlan(rows=4, capture_seed=3, replay_seeds=(4,))


def test_the_replay_plan_has_what_the_stale_size_needs():
    params = QUICK.inputs
    capture_max = int(OP.layout(params, REPLAY_PLAN.rows, REPLAY_PLAN.capture_seed).max())
    assert int(OP.layout(params, REPLAY_PLAN.rows, REPLAY_PLAN.replay_seeds[0]).max()) > capture_max


def _ctx(fn, device=CPU, grads=GRADS):
    return ProbeContext(op=OP, params=QUICK.inputs, fn=fn, grads=grads, device=device, reference_variant=OP.name)


def test_graph_replay_catches_a_size_kept_from_capture_time():
    record = graph_replay.graph_replay(_ctx(stale_table_size), REPLAY_PLAN, capture=DOUBLE)
    assert record.invariant is False and record.not_run is None
    for case in (record.forward, record.forward_backward):
        assert case.captured and case.replays == 1 and case.rows == REPLAY_PLAN.rows
        assert 0 < case.fwd_differ < case.rows  # the rows whose table row is past the stale size
        assert case.first_difference.tensor == "y"
    assert any(line.startswith("graph_replay forward: fwd") for line in gate.beyond_rfc_failures(
        _bi_with(graph=record)))


def test_graph_replay_passes_the_honest_composition_and_records_what_cannot_be_captured():
    assert graph_replay.graph_replay(_ctx(honest), REPLAY_PLAN, capture=DOUBLE).invariant is True

    def refuses(_step):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    record = graph_replay.graph_replay(_ctx(honest), REPLAY_PLAN, capture=refuses)
    assert record.invariant is None
    assert record.forward.reason == "cannot capture: RuntimeError: operation not permitted when stream is capturing"
    assert not record.forward.captured and record.forward.fwd_differ == 0
    assert gate.beyond_rfc_failures(_bi_with(graph=record)) == []


def test_graph_replay_is_not_run_off_cuda():
    record = graph_replay.graph_replay(_ctx(honest), REPLAY_PLAN)
    assert record.not_run == "CUDA graphs need a CUDA device; this run is on cpu" and record.forward is None


def _bi_with(graph):
    from h3bench.harness.probes import batch_invariance as bi

    ctx = _ctx(honest)
    plan = dataclasses.replace(QUICK.all_rows, batch_sizes=(2,))
    cases, repeatable = bi.all_rows(ctx, plan)
    subs = bi.full_vs_sub_batches(ctx, dataclasses.replace(QUICK.full_vs_sub, full_batch=4, sub_batch_sizes=(2,)))
    sweep = bi.batch_size_sweep(ctx, dataclasses.replace(QUICK.sweep, rows=2))
    return bi.verdict(cases, repeatable, subs, sweep, beyond={"graph_replay": graph})


def _capturing_on_cuda() -> bool:
    return torch.cuda.is_current_stream_capturing()


def stale_table_size_cuda(x, w, sh, sc, idx):
    return stale_table_size(x, w, sh, sc, idx, capturing=_capturing_on_cuda)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU (H3BENCH_TEST_DEVICE=cuda)")
def test_a_real_cuda_graph_keeps_the_stale_size_and_honest_rows_replay_clean():
    cuda = torch.device("cuda")
    record = graph_replay.graph_replay(_ctx(stale_table_size_cuda, cuda), REPLAY_PLAN)
    assert record.invariant is False and record.forward.captured and record.forward.fwd_differ > 0
    for adapter in [a for a in builtin_adapters("norm_modulate") if a.name in ("diffusers", "h3bench_triton")]:
        ctx = _ctx(adapter.load(cuda, QUICK.inputs).fn, cuda, adapter.grads)
        clean = graph_replay.graph_replay(ctx, REPLAY_PLAN)
        assert clean.invariant is True, (adapter.name, clean)
        assert clean.forward.captured and clean.forward_backward.captured, (adapter.name, clean)


# --- grad set ----------------------------------------------------------------------------------------------

def test_a_cheaper_path_for_a_frozen_weight_is_caught_by_grad_set_only(quick_rows):
    """The planted backward sums dx in bf16 when w is frozen: the RFC's probes (every gradient requested)
    and the other new probes pass it; grad set counts exactly the rows whose dx the two sums give apart,
    under the sets that freeze w, and none under the others."""
    bi = _bi(quick_rows, "frozen_weight_path")
    assert bi.batch_invariant is True and bi.params_repeatable is True
    assert bi.beyond_rfc["contention"].invariant is True and bi.beyond_rfc["layout"].invariant is True
    plan = QUICK.plan("grad_set")
    inputs, grad_out = OP.make_inputs(QUICK.inputs, plan.rows, plan.seeds[0], CPU), \
        OP.make_grad_outs(QUICK.inputs, plan.rows, plan.seeds[0], CPU)[0]
    t = inputs.tensors
    dy = grad_out * (1 + t["sc"].index_select(0, t["idx"]))  # what the modulation hands the norm
    apart = (as_bits(norm_dx(t["x"], t["w"], dy, True)) != as_bits(norm_dx(t["x"], t["w"], dy, False))).any(1)
    expected = int(apart.sum())
    assert expected > 0  # the plan's rows show the fault
    cases = bi.beyond_rfc["grad_set"].cases
    assert bi.beyond_rfc["grad_set"].invariant is False
    assert [cases[k].rowgrad_differ for k in FROZEN_SETS] == [expected, 0, 0, expected]
    first = cases["frozen w"].first_difference
    assert first.tensor == "grad x" and first.row == int(apart.nonzero()[0, 0]) and first.max_ulp >= 1
    assert cases["frozen sh"].first_difference is None
    failed = gate.what_failed(bi)
    assert [line.split(":")[0] for line in failed] == ["grad_set frozen w", "grad_set none requested"]
    assert failed[0].startswith(f"grad_set frozen w: rowgrad {expected} of {plan.rows} rows (first: grad x row ")
    statuses = {c.name: c.status for c in verdicts.checks(quick_rows.results["plain"]["frozen_weight_path"])}
    assert statuses["grad set"] is verdicts.Status.FAIL
    assert all(statuses[c] is not verdicts.Status.FAIL for c in verdicts.all_checks() if c != "grad set")


def test_a_refused_frozen_parameter_is_recorded_not_failed(quick_rows):
    bi = _bi(quick_rows, "needs_every_gradient")
    cases = bi.beyond_rfc["grad_set"].cases
    assert all(cases[k].rejected == f"rejects {k}: ValueError: every parameter must require grad"
               and (cases[k].rows, cases[k].rowgrad_differ) == (0, 0) for k in FROZEN_SETS)
    assert bi.beyond_rfc["grad_set"].invariant is None and gate.what_failed(bi) == []
    check = next(c for c in verdicts.checks(quick_rows.results["plain"]["needs_every_gradient"])
                 if c.name == "grad set")
    assert check.status is verdicts.Status.NA and "rejects frozen w" in check.detail


def test_the_file_names_the_grad_set_failure(quick_rows):
    evidence = from_json(to_dict(quick_rows))
    assert problems(evidence) == []
    lines = gate.failures(evidence, gate.ALL)
    assert any("frozen_weight_path" in line and "grad_set frozen w" in line for line in lines)
    assert not any("/own_backward " in line or "/needs_every_gradient " in line for line in lines)
    assert "frozen_weight_path: grad_set frozen w" in str(summary_table(evidence).caption)
    markdown = render_markdown(evidence)
    assert "grad set" in markdown and "frozen sh (grad x): 0/8 rows differ" in markdown


@pytest.mark.parametrize("grads,reason", [(("x",), "no parameter gradients: nothing to freeze"),
                                          ((), "no parameter gradients: nothing to freeze")])
def test_grad_set_without_parameter_gradients_is_not_applicable(grads, reason):
    ctx = _ctx(honest, grads=grads)
    plan = GradSetPlan(rows=2, seeds=(3,))
    record = grad_set.grad_set(ctx, plan)
    assert (record.not_applicable, record.invariant, record.cases) == (reason, None, {})
    assert grad_set.grad_set_total(plan, ctx) == 0


@pytest.mark.parametrize("op_name,reason,frozen_sets", [
    ("norm_modulate", None, 4), ("gate_residual", None, 1), ("final_adaln_out", None, 5),
    ("timestep_mlp", None, 5), ("adaln_projection", None, 3),
    # the table is the only differentiable input; the per-row inputs are indices
    ("adaln_row_gather", "no per-row gradients to compare", 0),
    ("timestep_sinusoid", "no parameter gradients: nothing to freeze", 0)])
def test_every_op_has_a_grad_set_plan_and_says_whether_it_applies(op_name, reason, frozen_sets):
    """Every op's plans have the probe; with every declared gradient its applicability and run count follow
    from the op's inputs (per-row gradients to compare, parameters to freeze)."""
    cfg = load_config(op_name, quick=False)
    assert (cfg.plan("grad_set").rows, cfg.plan("grad_set").seeds) == (257, (3,))
    op = get_op(op_name)
    ctx = ProbeContext(op=op, params=cfg.inputs, fn=None, grads=op.differentiable, device=CPU,
                       reference_variant=op.name)
    assert grad_set.not_applicable_reason(ctx) == reason
    assert grad_set.grad_set_total(cfg.plan("grad_set"), ctx) == (1 + frozen_sets if frozen_sets else 0)
    if reason is not None:  # recorded without running the implementation (fn=None)
        record = grad_set.grad_set(ctx, cfg.plan("grad_set"))
        assert (record.not_applicable, record.invariant, record.cases) == (reason, None, {})


def test_grad_set_runs_each_frozen_set_once_a_seed_with_the_same_inputs():
    """Which gradients each run requests, and that every run sees the same inputs and upstream gradients."""
    seen = []

    def recording(x, w, sh, sc, idx):
        seen.append((tuple(n for n, t in zip("x w sh sc".split(), (x, w, sh, sc)) if t.requires_grad),
                     as_bits(x).sum().item(), as_bits(idx).sum().item()))
        return composition(x, w, sh, sc, idx)

    plan = GradSetPlan(rows=3, seeds=(3, 4))
    record = grad_set.grad_set(_ctx(recording), plan)
    assert grad_set.grad_set_total(plan, _ctx(recording)) == 2 * 5 == len(seen)
    requested = [s[0] for s in seen[:5]]
    assert requested == [("x", "w", "sh", "sc"), ("x", "sh", "sc"), ("x", "w", "sc"), ("x", "w", "sh"), ("x",)]
    assert len({s[1:] for s in seen[:5]}) == 1 and len({s[1:] for s in seen[5:]}) == 1
    assert seen[0][1:] != seen[5][1:]
    assert record.invariant is True and all(c.rows == 6 for c in record.cases.values())
    assert grad_set.subsets(("w",)) == [("w",)] and grad_set.label(("w",), ("w",)) == "frozen w"


def test_our_triton_kernel_is_clean_under_grad_set(device):
    """Our kernel's backward without parameter gradients compiles without the parameter sums (PARAMS off):
    its dx must be the all-gradients dx (kernels/notes/norm_modulate.md)."""
    adapter = next(a for a in builtin_adapters("norm_modulate") if a.name == "h3bench_triton")
    params = dataclasses.replace(QUICK.inputs, hidden=16)
    ctx = ProbeContext(op=OP, params=params, fn=adapter.load(device, params).fn, grads=adapter.grads,
                       device=device, reference_variant=OP.name)
    record = grad_set.grad_set(ctx, GradSetPlan(rows=3, seeds=(3,)))
    assert record.invariant is True and list(record.cases) == FROZEN_SETS

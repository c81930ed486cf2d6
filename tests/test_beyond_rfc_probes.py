"""The probes beyond the RFC's (contention, graph replay, layout) each catch a fault the RFC's probes pass.

Each planted implementation is the honest composition with one fault that shows only under one new probe:
a result that changes while a side load runs (contention), a slow path for strided inputs that sums in
another order (layout), a size read from a Python global that a graph keeps from capture time (graph
replay: on the CPU through a capture double, on a GPU through a real CUDA graph). The honest rows (the
composition, diffusers, our Triton kernel) are clean under all three; an implementation that rejects
non-contiguous inputs records the rejection, which is no failure.
"""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from h3bench.adapters import builtin_adapters
from h3bench.harness import gate
from h3bench.harness.config import ContentionPlan, GraphReplayPlan, LayoutPlan, load_config
from h3bench.harness.ops import get_op
from h3bench.harness.probes import contention, graph_replay, layout
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


PLANTED = {"under_side_load": under_side_load, "strided_slow_path": strided_slow_path,
           "contiguous_only": contiguous_only, "honest": honest}


@pytest.fixture(scope="module")
def quick_rows() -> dict:
    """The planted rows, the composition and diffusers, through the quick plan (every probe) in one run."""
    return run_norm_modulate_rows(PLANTED, [a for a in builtin_adapters("norm_modulate") if a.name == "diffusers"])


def _bi(evidence, name):
    return evidence.results["plain"][name].batch_invariance


@pytest.mark.parametrize("name", ["honest", "diffusers"])
def test_honest_rows_are_clean_under_every_probe(quick_rows, name):
    bi = _bi(quick_rows, name)
    assert bi.batch_invariant is True
    assert bi.contention.invariant is True and bi.layout.invariant is True
    assert set(bi.layout.cases) == {"row_offset", "padded_rows", "column_major"}
    assert bi.layout.cases["row_offset"].tensors == ["x", "idx"]
    assert all(c.rejected is None and c.rows == QUICK.layout.rows for c in bi.layout.cases.values())
    assert bi.graph_replay.invariant is None and bi.graph_replay.not_run == graph_replay.not_run_reason(CPU)
    assert gate.what_failed(bi) == []


def test_the_loads_overlap_the_rows_runs(quick_rows):
    record = _bi(quick_rows, "honest").contention
    plan = QUICK.contention
    runs = plan.rows + len(plan.sub_batches()) + 1
    assert record.idle.comparisons == 2 * plan.rows and record.idle.params_repeatable is True
    for case in record.loads.values():
        assert case.runs == runs and case.comparisons == 3 * plan.rows
        assert case.iterations >= 1 and case.overlapped >= 1


def test_a_result_that_races_the_side_load_is_caught_by_contention_only(quick_rows):
    bi = _bi(quick_rows, "under_side_load")
    assert bi.batch_invariant is True and bi.params_repeatable is True  # the RFC's probes pass it
    assert bi.layout.invariant is True
    record = bi.contention
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
    assert bi.batch_invariant is True and bi.contention.invariant is True
    cases = bi.layout.cases
    assert bi.layout.invariant is False
    assert cases["row_offset"].fwd_differ == 0  # a row slice is still contiguous: the fast path
    for name in ("padded_rows", "column_major"):
        assert cases[name].fwd_differ > 0 and cases[name].first_difference is not None
    assert any(line.startswith("layout padded_rows: fwd") for line in gate.what_failed(bi))


def test_a_rejected_layout_is_recorded_not_failed(quick_rows):
    bi = _bi(quick_rows, "contiguous_only")
    cases = bi.layout.cases
    assert cases["padded_rows"].rejected == "rejects padded_rows: ValueError: x must be contiguous"
    assert cases["column_major"].rejected == "rejects column_major: ValueError: x must be contiguous"
    assert (cases["padded_rows"].rows, cases["padded_rows"].fwd_differ) == (0, 0)
    assert cases["row_offset"].rejected is None and cases["row_offset"].rows == QUICK.layout.rows
    assert bi.layout.invariant is True and gate.what_failed(bi) == []
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
    evidence.results["plain"]["under_side_load"].batch_invariance.contention.invariant = True
    evidence.results["plain"]["strided_slow_path"].batch_invariance.layout.invariant = True
    found = problems(evidence)
    assert any(p.endswith("contention.invariant: True but its counts say False") for p in found)
    assert any(p.endswith("layout.invariant: True but its counts say False") for p in found)


def test_a_config_without_the_new_tables_leaves_them_out():
    from h3bench.harness.config import build_config

    data = {k: v for k, v in QUICK.to_dict().items() if k not in ("op", "quick", "plans")}
    old = {k: v for k, v in data.items() if k not in ("contention", "graph_replay", "layout")}
    built = build_config("norm_modulate", old, True, "old.toml")
    assert (built.contention, built.graph_replay, built.layout) == (None, None, None)
    assert "contention" not in built.to_dict()
    assert build_config("norm_modulate", data, True, "new.toml").contention == QUICK.contention


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
    return bi.verdict(cases, repeatable, subs, sweep, graph_replay=graph)


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

"""Count parity with the prior art: the default plan, run in full on the CPU at hidden=8.

The plan's sizes do not depend on the hidden size, so a tiny row width makes the whole default probe
plan (not accuracy_latency) cheap enough for the CPU suite while producing the GPU plan's counts.
"""
from __future__ import annotations

import time
import warnings

import torch

from h3bench.harness.config import load_config
from h3bench.harness.ops import get_op
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.probes.context import ProbeContext

# The prior art's numbers (docs/probes.md and tests/data/norm_modulate_b200.json), written out.
PRIOR_BATCH_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255,
                     256, 257, 511, 512, 513, 1023, 1024, 1025, 2047, 2048]
PRIOR_PROBE_ROWS = [0, 259, 515, 771, 1027, 1283, 1539, 2047]
PRIOR_ALL_ROWS = {"64": 192, "257": 771, "2048": 6144}
PRIOR_SUB_BATCH_SIZES = [1, 7, 4097, 32768, 65536]
PRIOR_SUB_BATCHES = 2124
PRIOR_COMPARISONS = 2256
SLOW_S = 120  # seconds; a longer full run here is reported as a warning

CONFIG = load_config("norm_modulate", overrides=("hidden=8",))


def test_default_plan_is_the_prior_art_plan():
    assert CONFIG.quick is False and CONFIG.inputs.hidden == 8
    assert CONFIG.sweep.batch_sizes() == PRIOR_BATCH_SIZES and len(PRIOR_BATCH_SIZES) == 32
    assert CONFIG.sweep.probe_rows() == PRIOR_PROBE_ROWS
    assert bi.sub_batches_total(CONFIG.full_vs_sub) == PRIOR_SUB_BATCHES
    assert bi.sweep_total(CONFIG.sweep) == PRIOR_COMPARISONS
    assert {str(n): n * len(CONFIG.all_rows.seeds) for n in CONFIG.all_rows.batch_sizes} == PRIOR_ALL_ROWS
    assert bi.all_rows_total(CONFIG.all_rows) == sum(PRIOR_ALL_ROWS.values())
    assert list(CONFIG.full_vs_sub.sub_batch_sizes) == PRIOR_SUB_BATCH_SIZES
    assert CONFIG.full_vs_sub.full_batch == 131072 and CONFIG.full_vs_sub.seeds == (3, 4)
    # the README's rule for where sub-batches start
    for size in PRIOR_SUB_BATCH_SIZES:
        assert CONFIG.full_vs_sub.step(size) == (size if size >= 1024 else max(size, 131072 // 512))


def test_full_default_plan_runs_with_the_prior_art_counts():
    from h3bench.adapters.norm_modulate.torch_rms_norm import ADAPTER

    op, cpu = get_op("norm_modulate"), torch.device("cpu")
    progress: list[int] = []
    ctx = ProbeContext(op=op, params=CONFIG.inputs, fn=ADAPTER.load(cpu, CONFIG.inputs).fn, grads=ADAPTER.grads,
                       device=cpu, reference_variant=ADAPTER.reference, progress=progress.append)
    started = time.perf_counter()
    cases, repeatable = bi.all_rows(ctx, CONFIG.all_rows)
    all_rows_progress = sum(progress)
    subs = bi.full_vs_sub_batches(ctx, CONFIG.full_vs_sub)
    sweep = bi.batch_size_sweep(ctx, CONFIG.sweep)
    wall = time.perf_counter() - started
    found = bi.verdict(cases, repeatable, subs, sweep)

    assert {k: c.rows for k, c in found.all_rows.items()} == PRIOR_ALL_ROWS
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in found.all_rows.values())
    assert found.params_repeatable is True  # torch_rms_norm has a w gradient
    assert (subs.full_batch, subs.sub_batch_sizes, subs.sub_batches) == (131072, PRIOR_SUB_BATCH_SIZES,
                                                                         PRIOR_SUB_BATCHES)
    assert (subs.fwd_differ, subs.rowgrad_differ) == (0, 0)
    assert (sweep.batch_sizes, sweep.probe_rows, sweep.comparisons) == (PRIOR_BATCH_SIZES, PRIOR_PROBE_ROWS,
                                                                        PRIOR_COMPARISONS)
    assert (sweep.differ, sweep.first_failures) == (0, [])
    assert found.batch_invariant is True
    # the progress units the CLI shows add up to the same totals
    assert all_rows_progress == sum(PRIOR_ALL_ROWS.values())
    assert sum(progress) == sum(PRIOR_ALL_ROWS.values()) + PRIOR_SUB_BATCHES + PRIOR_COMPARISONS
    if wall > SLOW_S:  # a warning, not a failure: slow CI machines must not turn the suite red
        warnings.warn(f"the full default probe plan at hidden=8 took {wall:.0f}s (over {SLOW_S}s)")

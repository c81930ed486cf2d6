"""Shared bits of the CPU tests: where the prior-art file lives, and the honest composition."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
PRIOR_ART_NAME = "norm_modulate_b200.json"
# shared/ beside the clone (the workspace and CI layout), or inside it (a copied working tree); last, the
# copy under tests/data (taken from shared/prior-art on 2026-12-02), so a lone clone still checks the contract.
PRIOR_ART_CANDIDATES = (REPO.parent / "shared" / "prior-art" / PRIOR_ART_NAME,
                        REPO / "shared" / "prior-art" / PRIOR_ART_NAME,
                        REPO / "tests" / "data" / PRIOR_ART_NAME)


def prior_art_path() -> Optional[Path]:
    return next((p for p in PRIOR_ART_CANDIDATES if p.is_file()), None)


def require_prior_art() -> Path:
    import pytest

    path = prior_art_path()
    if path is None:
        pytest.skip("prior-art file not found; looked at " + ", ".join(map(str, PRIOR_ART_CANDIDATES)))
    return path


def nm_params(hidden: int = 64, dtype: str = "bfloat16", **changes):
    """norm_modulate's parameters at the default config's constants, with `hidden` and `dtype` set."""
    import dataclasses

    from harness.config import load_config

    base = load_config("norm_modulate").inputs
    return dataclasses.replace(base, hidden=hidden, dtype=dtype, **changes)


def composition(x, w, sh, sc, idx):
    """The op as diffusers composes it: F.rms_norm, then index_select modulation."""
    y = F.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)


def even(t: torch.Tensor) -> bool:
    return t.shape[0] % 2 == 0


# The RFC's counts per plan set (shared/prior-art/README.md, OPERATORS.md), written out.
RFC_ALL_ROWS = {"64": 192, "257": 771, "2048": 6144}
RFC_SUB_BATCHES = {"token": 2124, "timestep": 2060, "sinusoid": 2060}
RFC_FULL_BATCH = {"token": 131072, "timestep": 4096, "sinusoid": 8192}
RFC_COMPARISONS = 2256


def run_default_plan_counts(op_name: str, overrides: tuple[str, ...], adapter):
    """The op's default probe plan (all_rows, full_vs_sub_batches, batch_size_sweep) run in full on the
    CPU at the tiny sizes `overrides` sets, through `adapter`; asserts the RFC's counts for the op's plan
    set and returns the verdict for the caller's own checks."""
    from harness.config import load_config
    from harness.ops import get_op
    from harness.probes import batch_invariance as bi
    from harness.probes.context import ProbeContext

    config = load_config(op_name, overrides=overrides)
    op, cpu = get_op(op_name), torch.device("cpu")
    assert config.quick is False and config.plans == op.plan_set
    ctx = ProbeContext(op=op, params=config.inputs, fn=adapter.load(cpu, config.inputs).fn, grads=adapter.grads,
                       device=cpu, reference_variant=adapter.reference or op.name)
    cases, repeatable = bi.all_rows(ctx, config.all_rows)
    subs = bi.full_vs_sub_batches(ctx, config.full_vs_sub)
    sweep = bi.batch_size_sweep(ctx, config.sweep)
    found = bi.verdict(cases, repeatable, subs, sweep)
    assert {k: c.rows for k, c in found.all_rows.items()} == RFC_ALL_ROWS
    assert subs.full_batch == RFC_FULL_BATCH[op.plan_set]
    assert subs.sub_batches == RFC_SUB_BATCHES[op.plan_set] == bi.sub_batches_total(config.full_vs_sub)
    assert sweep.comparisons == RFC_COMPARISONS == bi.sweep_total(config.sweep)
    return found

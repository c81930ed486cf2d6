"""Accuracy against float64 and latency, per row count.

Accuracy: max|out - ref| / max|ref|, the reference computed in float64 on the same rounded inputs. On
a GPU the caching allocator is filled with NaN first, so an output element the implementation never
writes shows up as NaN (an infinite error) instead of passing on stale memory.

Latency, three ways (medians; each timed `repeats` times, the extra medians kept as *_repeat):
- fwd_us: forward alone, no autograd graph.
- fwd_bwd_us: as the prior art timed it: fresh cloned leaves and an all-ones upstream gradient made
  inside the timed step.
- fwd_bwd_net_us: forward + backward only; leaves and the upstream gradient made before the sample.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from harness.config import AccuracyPlan, TimingPlan
from harness.execute import execute, make_leaves
from harness.probes.context import ProbeContext
from harness.schema import SizeResult
from harness.timing import sample

POISON_FACTOR = 8  # poison this many times the output's bytes of free cached memory


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|; NaN or inf anywhere in `out` makes it infinite."""
    out64 = out.double()
    if not bool(torch.isfinite(out64).all()):
        return math.inf
    scale = ref.abs().max().item() if ref.numel() else 0.0
    err = (out64 - ref).abs().max().item() if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def poison_cached_memory(device: torch.device, nbytes: int) -> None:
    """Fill free blocks of the CUDA caching allocator with 0xFF (NaN in bf16/fp16/fp32)."""
    if device.type != "cuda" or nbytes <= 0:
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    del block


def accuracy_latency(ctx: ProbeContext, accuracy: AccuracyPlan, timing: TimingPlan,
                     bandwidth_gbps: Optional[float]) -> dict[str, SizeResult]:
    results = {}
    for rows in accuracy.rows:
        results[str(rows)] = _one_size(ctx, rows, accuracy, timing, bandwidth_gbps)
        ctx.progress(1)
    return results


def _one_size(ctx: ProbeContext, rows: int, accuracy: AccuracyPlan, timing: TimingPlan,
              bandwidth_gbps: Optional[float]) -> SizeResult:
    inputs = ctx.inputs(rows, accuracy.input_seed)
    grad_out = ctx.grad_out(rows, accuracy.grad_seed)
    backward = bool(ctx.grads)
    poison_cached_memory(ctx.device, POISON_FACTOR * grad_out.numel() * grad_out.element_size())
    out = execute(ctx.fn, inputs, grad_out if backward else None, ctx.grads)
    ref = ctx.op.reference(ctx.params, inputs, grad_out if backward else None, ctx.grads,
                           ctx.reference_variant)
    result = SizeResult(fwd_rel_err=rel_err(out.output, ref.output), fwd_us=0.0)
    if backward:
        result.grad_rel_err = {name: rel_err(out.grads[name], ref.grads[name]) for name in ctx.grads}
    del out, ref

    fwd = _medians(timing, lambda: _forward(ctx, inputs), ctx.device)
    result.fwd_us, result.fwd_us_repeat = fwd[0], _second(fwd)
    if backward:
        seed_style = _medians(timing, lambda: _fwd_bwd_fresh(ctx, inputs), ctx.device)
        result.fwd_bwd_us, result.fwd_bwd_us_repeat = seed_style[0], _second(seed_style)
        net = _net_fwd_bwd(ctx, inputs, timing)
        result.fwd_bwd_net_us, result.fwd_bwd_net_us_repeat = net[0], _second(net)
    _add_floor(ctx, rows, result, bandwidth_gbps)
    return result


def _second(medians: list[float]) -> Optional[float]:
    return medians[1] if len(medians) > 1 else None


def _medians(timing: TimingPlan, step, device, setup=None) -> list[float]:
    return [sample(step, device, timing.warmup, timing.reps, setup).median_us
            for _ in range(max(1, timing.repeats))]


def _forward(ctx: ProbeContext, inputs) -> None:
    with torch.no_grad():
        ctx.fn(*inputs.tensors.values())


def _fwd_bwd_fresh(ctx: ProbeContext, inputs) -> None:
    leaves = [t.detach().clone().requires_grad_() if name in ctx.grads else t
              for name, t in inputs.tensors.items()]
    y = ctx.fn(*leaves)
    y.backward(torch.ones_like(y))


def _net_fwd_bwd(ctx: ProbeContext, inputs, timing: TimingPlan) -> list[float]:
    leaves = make_leaves(inputs, ctx.grads)
    with torch.no_grad():
        ones = torch.ones_like(ctx.fn(*leaves))

    def clear() -> None:
        for leaf in leaves:
            leaf.grad = None

    def step() -> None:
        ctx.fn(*leaves).backward(ones)

    return _medians(timing, step, ctx.device, setup=clear)


def _add_floor(ctx: ProbeContext, rows: int, result: SizeResult, bandwidth_gbps: Optional[float]) -> None:
    if not bandwidth_gbps:
        return
    result.fwd_floor_us = ctx.op.floor_bytes(ctx.params, rows, backward=False) / (bandwidth_gbps * 1e3)
    result.fwd_floor_fraction = result.fwd_floor_us / result.fwd_us
    if result.fwd_bwd_us is not None:
        result.fwd_bwd_floor_us = ctx.op.floor_bytes(ctx.params, rows, backward=True) / (bandwidth_gbps * 1e3)
        result.fwd_bwd_floor_fraction = result.fwd_bwd_floor_us / result.fwd_bwd_us
        result.fwd_bwd_net_floor_fraction = result.fwd_bwd_floor_us / result.fwd_bwd_net_us

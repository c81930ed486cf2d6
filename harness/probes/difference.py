"""Where two results that should be bitwise equal differ, and how far: the first differing row and element,
the largest absolute difference, and the largest distance in units in the last place (ULP) of the tensor's
own dtype. No determinism suite we know of (vLLM's, SGLang's, Megatron's, batch_invariant_ops) says more
than "differs"; a ULP distance tells a last-bit reduction-order change (1-2 ULP) from a real bug."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.probes.difference_text import NAN_ULP
from h3bench.harness.schema import Difference, ParamDifference


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """The float's bit pattern as an int64 that orders like the values (sign-magnitude to a signed line):
    adjacent floats differ by 1, +0 and -0 are both 0."""
    bits = as_bits(t)
    width = t.element_size() * 8
    negative = bits >= (1 << (width - 1)) if bits.dtype == torch.uint8 else bits < 0  # the sign bit
    magnitude = bits.to(torch.int64) & ((1 << (width - 1)) - 1)
    return torch.where(negative, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise |a - b| in ULPs of their (shared) floating dtype; NAN_ULP where one side alone is NaN;
    integers: their absolute difference."""
    if not a.dtype.is_floating_point:
        return (a.to(torch.int64) - b.to(torch.int64)).abs()
    distance = (ordered_bits(a) - ordered_bits(b)).abs()
    one_nan = torch.isnan(a) ^ torch.isnan(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    distance = torch.where(both_nan, torch.zeros_like(distance), distance)
    return torch.where(one_nan, torch.full_like(distance, NAN_ULP), distance)


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest finite |a - b| (in float64); NaN when no difference is finite."""
    delta = (a.double() - b.double()).abs()
    finite = delta[torch.isfinite(delta)]
    return float(finite.max()) if finite.numel() else float("nan")


def _max_ulp(distance: torch.Tensor) -> int:
    return NAN_ULP if bool((distance == NAN_ULP).any()) else int(distance.max()) if distance.numel() else 0


def first_difference(pairs: Sequence[tuple[str, torch.Tensor, torch.Tensor]], *, seed: int, batch: int,
                     positions: Sequence[int], rows: Sequence[int]) -> Optional[Difference]:
    """The first tensor of `pairs` (name, got, expected: equal shapes, compared rows on dim 0) that differs
    in any bit: its first differing compared row, reported as that row's place in the batch of `batch` rows
    it rode in (`positions[i]`) and its index among the seed's inputs (`rows[i]`), the element within the
    row, and how far the tensor is off over all compared rows. None when every pair is bitwise equal."""
    for name, got, want in pairs:
        if got.shape != want.shape or got.dtype != want.dtype:
            continue  # a contract breach, reported as such elsewhere
        differs = (as_bits(got) != as_bits(want)).reshape(got.shape[0] if got.dim() else 1, -1)
        if not bool(differs.any()):
            continue
        flat = int(differs.reshape(-1).nonzero()[0, 0])
        i, element = divmod(flat, differs.shape[1])
        return Difference(tensor=name, seed=seed, batch=batch, position=int(positions[i]), row=int(rows[i]),
                          element=element, max_abs=_max_abs(got, want), max_ulp=_max_ulp(ulp_distance(got, want)))
    return None


def param_difference(name: str, a: torch.Tensor, b: torch.Tensor) -> Optional[ParamDifference]:
    """How a parameter gradient's two runs differ; None when bitwise equal."""
    differs = as_bits(a) != as_bits(b)
    count = int(differs.sum())
    if count == 0:
        return None
    return ParamDifference(param=name, elements=count, numel=a.numel(), max_abs=_max_abs(a, b),
                           max_ulp=_max_ulp(ulp_distance(a, b)))

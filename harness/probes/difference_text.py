"""A recorded difference (harness/probes/difference.py) in words, for the gate and the reports: without
torch, which a command that only reads evidence (`h3bench report`) does not import."""
from __future__ import annotations

from h3bench.harness.schema import Difference, ParamDifference

NAN_ULP = -1  # a NaN on one side only: no distance


def _ulp_text(max_ulp: int) -> str:
    return "a NaN on one side" if max_ulp == NAN_ULP else f"up to {max_ulp} ULP"


def describe(d: Difference) -> str:
    """`y row 5 element 17 (position 5 in a batch of 32, seed 3), up to 2 ULP, |diff| up to 0.0312`."""
    return (f"{d.tensor} row {d.row} element {d.element} (position {d.position} in a batch of {d.batch}, "
            f"seed {d.seed}), {_ulp_text(d.max_ulp)}, |diff| up to {d.max_abs:.3g}")


def describe_param(p: ParamDifference) -> str:
    """`w 3/64 elements, up to 2 ULP`."""
    return f"{p.param} {p.elements}/{p.numel} elements, {_ulp_text(p.max_ulp)}"

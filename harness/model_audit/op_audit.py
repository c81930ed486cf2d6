"""The built-in op that audits an origin's op, with the `h3bench run` line at the shape the model gave it:
a matrix product (aten::mm, addmm, linear, matmul) -> `linear`, an RMSNorm -> `rms_norm`, a layer norm ->
`layer_norm`, a softmax -> `softmax`, and the RFC's seven ops where the origin's module is named after
one. The op-level audit (which implementation is invariant, and how fast) is then one command away."""
from __future__ import annotations

from typing import Optional

from h3bench.harness.localize.records import BACKWARD, Origin
from h3bench.harness.model_schema import OpAudit

MATMULS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}
SOFTMAX = {"aten::_softmax", "aten::softmax", "aten::_safe_softmax"}
RMS_NORM = {"aten::_fused_rms_norm", "aten::rms_norm"}
LAYER_NORM = {"aten::native_layer_norm", "aten::layer_norm"}
RFC_OPS = ("norm_modulate", "timestep_sinusoid", "timestep_mlp", "adaln_projection", "adaln_row_gather",
           "gate_residual", "final_adaln_out")
# the RFC ops' width input, where they have one
RFC_HIDDEN = {"norm_modulate": "hidden", "gate_residual": "hidden", "final_adaln_out": "hidden"}


def _line(op: str, sets: dict) -> str:
    """The command, with only the sizes the op's config has (a `--set` of another key is refused)."""
    import dataclasses

    from h3bench.harness.config import load_config

    known = {f.name for f in dataclasses.fields(load_config(op).inputs)}
    return " ".join(["h3bench run --op", op, *(f"--set {k}={v}" for k, v in sets.items() if k in known)])


def _last(origin: Origin) -> Optional[int]:
    shapes = [t.shape for t in origin.outputs if t.shape] or [t.shape for t in origin.inputs if t.shape]
    return shapes[0][-1] if shapes else None


def audit(origin: Origin) -> Optional[OpAudit]:
    """The audit line for `origin`, or None when no built-in op matches it."""
    op, kind = origin.op or "", origin.module_type.lower()
    dtype = origin.outputs[0].dtype if origin.outputs else None
    typed = {"dtype": dtype} if dtype else {}
    path = origin.module.lower()
    for name in RFC_OPS:
        if name in path or name.replace("_", "") in kind:
            sets = {RFC_HIDDEN[name]: _last(origin)} if name in RFC_HIDDEN and _last(origin) else {}
            return OpAudit(origin.op or "", origin.module_type, name, _line(name, {**sets, **typed}))
    if (op in MATMULS or "linear" in kind) and origin.inputs and origin.outputs and len(origin.inputs[0].shape) >= 1:
        if origin.phase == BACKWARD:  # the gradient of the input: [M, N] @ W[N, K] -> [M, K]
            k, n = origin.outputs[0].shape[-1], origin.inputs[0].shape[-1]
        else:
            k, n = origin.inputs[1 if op == "aten::addmm" else 0].shape[-1], origin.outputs[0].shape[-1]
        return OpAudit(op, origin.module_type, "linear",
                       _line("linear", {"in_features": k, "out_features": n, **typed}))
    width = _last(origin)
    if width is None:
        return None
    if op in RMS_NORM or "rmsnorm" in kind:
        return OpAudit(op, origin.module_type, "rms_norm", _line("rms_norm", {"hidden": width, **typed}))
    if op in LAYER_NORM or "layernorm" in kind:
        return OpAudit(op, origin.module_type, "layer_norm", _line("layer_norm", {"hidden": width, **typed}))
    if op in SOFTMAX:
        return OpAudit(op, origin.module_type, "softmax", _line("softmax", {"width": width, **typed}))
    return None

"""`timestep_mlp(x, w1, b1, w2, b2)`: argument checks and autograd around kernels/timestep_mlp_kernel.py (the
GEMMs' launch configurations, the no-grad forward, forward and backward), and the custom ops torch.compile
captures (kernels/custom_ops.py)."""
from __future__ import annotations

import torch
from torch import Tensor

from h3bench.kernels import checks
from h3bench.kernels import timestep_mlp_kernel as K
from h3bench.kernels.common import interpreter_active
from h3bench.kernels.custom_ops import Record, compiling, needed, on_device, present, require_training


def _check(x, w1, b1, w2, b2) -> None:
    named = {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    checks.tensors(named)
    checks.same_device(named, "x")
    checks.triton_device("x", x, what="the Triton kernels need", any_device_interpreted=True)
    for name, t in named.items():
        checks.dtype_in(name, t, (torch.float32,), "timestep_mlp is fp32 throughout (expected torch.float32)")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, freq_dim], got shape {tuple(x.shape)}")
    if w1.dim() != 2 or w1.shape[1] != x.shape[1] or w1.shape[0] < 1:
        raise ValueError(f"w1 must be [hidden, {x.shape[1]}] (x is [T, {x.shape[1]}]), got {tuple(w1.shape)}")
    if x.shape[1] < 1:
        raise ValueError(f"x must have freq_dim >= 1, got shape {tuple(x.shape)}")
    hidden = w1.shape[0]
    if b1.shape != (hidden,):
        raise ValueError(f"b1 must have shape ({hidden},) to match w1, got {tuple(b1.shape)}")
    if w2.dim() != 2 or w2.shape[1] != hidden or w2.shape[0] < 1:
        raise ValueError(f"w2 must be [temb_dim, {hidden}] (w1 has {hidden} rows), got {tuple(w2.shape)}")
    if b2.shape != (w2.shape[0],):
        raise ValueError(f"b2 must have shape ({w2.shape[0]},) to match w2, got {tuple(b2.shape)}")


def _fast_ok(x, w1, b1, w2, b2) -> bool:
    """Every argument well formed and all on one CUDA device, or all on the CPU under the interpreter (the
    common case, checked with attribute reads only; the CPU case so the tests and tools/hostcost_cpu.py
    take the path a GPU call takes). False sends the call through `_check`, which raises naming the
    argument or accepts what this does not cover. True only where `_check` passes (tests)."""
    try:
        f32 = torch.float32
        if not (x.dtype == f32 and w1.dtype == f32 and b1.dtype == f32 and w2.dtype == f32 and b2.dtype == f32):
            return False
        device = x.get_device()
        if device >= 0:
            same = (x.is_cuda and w1.is_cuda and b1.is_cuda and w2.is_cuda and b2.is_cuda
                    and w1.get_device() == device and b1.get_device() == device and w2.get_device() == device
                    and b2.get_device() == device)
        else:
            same = x.is_cpu and w1.is_cpu and b1.is_cpu and w2.is_cpu and b2.is_cpu and interpreter_active()
        hidden = w1.shape[0]
        return (same and x.dim() == 2 and w1.dim() == 2 and w2.dim() == 2 and b1.dim() == 1 and b2.dim() == 1
                and 0 < x.shape[1] == w1.shape[1] and 0 < hidden == b1.shape[0] == w2.shape[1]
                and 0 < w2.shape[0] == b2.shape[0])
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return False


class _TimestepMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        out, h, z1, (h_max, w2_max) = K.forward(x, w1, b1, w2, b2, keep_pre=True)
        ctx.save_for_backward(x, w1, w2, h, z1, h_max, w2_max)
        return out

    @staticmethod
    def backward(ctx, dy):
        return K.backward(dy, *ctx.saved_tensors, *ctx.needs_input_grad[:5])


def timestep_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """out = W2 silu(W1 x + b1) + b2 with gradients for x, w1, b1, w2 and b2.

    x: [T, F] fp32; w1: [Hd, F]; b1: [Hd]; w2: [D, Hd]; b2: [D], all fp32 on one device (CUDA, or the
    CPU under TRITON_INTERPRET=1). T = 0 gives an empty [0, D] output and zero weight gradients.
    Each output row is bitwise the same whatever T is; the weight gradients repeat bitwise."""
    if compiling():  # torch.compile captures the custom ops (below)
        return _traced(x, w1, b1, w2, b2)
    if not _fast_ok(x, w1, b1, w2, b2):
        _check(x, w1, b1, w2, b2)
    if x.is_cuda and x.get_device() != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # triton launches on the current device
            return timestep_mlp(x, w1, b1, w2, b2)
    if torch.is_grad_enabled() and (x.requires_grad or w1.requires_grad or b1.requires_grad or w2.requires_grad
                                    or b2.requires_grad):
        return _TimestepMLP.apply(x, w1, b1, w2, b2)
    return K.inference(x, w1, b1, w2, b2)


# --- the custom ops torch.compile captures (kernels/custom_ops.py) ----------------------------------------

def _traced(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """The call as a traced graph holds it: the forward op, in the mode the eager call would take."""
    training = torch.is_grad_enabled() and (x.requires_grad or w1.requires_grad or b1.requires_grad
                                            or w2.requires_grad or b2.requires_grad)
    return _op(x, w1, b1, w2, b2, training)[0]


@torch.library.custom_op("h3bench::timestep_mlp", mutates_args=())
def _op(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, training: bool) -> tuple[Tensor, list[Tensor]]:
    """(out, what the backward op needs: [h, z1] and the row maxima of h and w2 where the configs take
    them; [] without `training`, the no-grad path)."""
    with on_device(x):
        if not training:
            return K.inference(x, w1, b1, w2, b2), []
        ctx = Record()
        out = _TimestepMLP.forward(ctx, x, w1, b1, w2, b2)
    return out, [t for t in ctx.saved_tensors[3:] if t is not None]


@_op.register_fake
def _fake(x, w1, b1, w2, b2, training):
    _check(x, w1, b1, w2, b2)
    rows = x.shape[0]
    out = x.new_empty((rows, w2.shape[0]))
    if not training:
        return out, []
    kept = [x.new_empty((rows, w1.shape[0])) for _ in range(2)]
    if K.wants_maxima(K.configs(), rows, keep_pre=True):
        kept += [x.new_empty((rows,)), x.new_empty((w2.shape[0],))]
    return out, kept


@torch.library.custom_op("h3bench::timestep_mlp_backward", mutates_args=())
def _backward_op(dy: Tensor, x: Tensor, w1: Tensor, w2: Tensor, kept: list[Tensor], needs: list[bool]
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dW1, db1, dW2, db2), each empty where `needs` has no gradient: `_TimestepMLP.backward`."""
    h, z1, h_max, w2_max = (kept + [None, None])[:4]
    with on_device(x):
        return present(_TimestepMLP.backward(Record((x, w1, w2, h, z1, h_max, w2_max), needs), dy), x)


@_backward_op.register_fake
def _backward_fake(dy, x, w1, w2, kept, needs):
    grads = (x.new_empty(x.shape), w1.new_empty(w1.shape), w1.new_empty(w1.shape[0]), w2.new_empty(w2.shape),
             w2.new_empty(w2.shape[0]))
    return present(needed(grads, needs), x)


def _setup(ctx, inputs, output) -> None:
    x, w1, _, w2, _, ctx.training = inputs
    ctx.save_for_backward(x, w1, w2, *output[1])


def _backward(ctx, dy, _):
    require_training(ctx, "timestep_mlp")
    x, w1, w2, *kept = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:5])
    return (*needed(_backward_op(dy, x, w1, w2, kept, needs), needs), None)


_op.register_autograd(_backward, setup_context=_setup)

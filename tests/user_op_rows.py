"""Rows for docs/examples/rms_norm_op.py's user op, each the honest RMSNorm (docs/examples/rms_norm_impl.py)
with one planted fault or one break of the op's contract, run from the command line by tests/test_user_op.py
(`--adapter tests/user_op_rows.py:NAME`)."""
from __future__ import annotations

import itertools

import torch

from docs.examples.rms_norm_impl import rms_norm

SWITCH_ROWS = 256  # where kernels commonly switch strategy (a tile of 256 rows)
BUMP = 2 ** -5     # larger than a bf16 ulp: changes the bits of every non-zero element


def honest(x, weight, *, eps):
    return rms_norm(x, weight, eps=eps)


def split_reduction_from_256(x, weight, *, eps):
    """From 256 rows the sum of squares is split in two halves whose partial sums are stored in the input's
    dtype before they are added (a split reduction whose partials round): those rows' bits change."""
    if x.shape[0] < SWITCH_ROWS:
        return rms_norm(x, weight, eps=eps)
    wide, half = x.float(), x.shape[-1] // 2
    partials = [wide[:, part].pow(2).sum(-1, keepdim=True).to(x.dtype).float()
                for part in (slice(None, half), slice(half, None))]
    normed = wide * torch.rsqrt((partials[0] + partials[1]) / x.shape[-1] + eps)
    return (normed * weight.float()).to(x.dtype)


def odd_batch_tail(x, weight, *, eps):
    """In a batch of odd size the last row goes through a tail path that computes in the input's dtype."""
    y = rms_norm(x, weight, eps=eps)
    if x.shape[0] % 2 == 0:
        return y
    last = x[-1:]
    tail = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + eps) * weight
    return torch.cat([y[:-1], tail])


def row_position(x, weight, *, eps):
    """Every row but the first of its batch is scaled a little: a row's bits depend on where it sits (a row
    alone is always first)."""
    y = rms_norm(x, weight, eps=eps)
    scale = torch.ones(x.shape[0], 1, dtype=y.dtype, device=y.device)
    scale[1:] += BUMP
    return y * scale


_RUNS = itertools.count()


class ScaleWithGradInRunOrder(torch.autograd.Function):
    """normed * weight whose weight gradient adds the rows' contributions in the input's dtype, in an order
    that changes with every backward (a stand-in for atomics). Also the planted fault of tests/test_testing_api.py."""

    @staticmethod
    def forward(ctx, normed, weight):
        ctx.save_for_backward(normed, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, weight = ctx.saved_tensors
        order = torch.randperm(grad.shape[0], generator=torch.Generator().manual_seed(next(_RUNS)))
        dweight = torch.zeros_like(weight)
        for r in order.tolist():
            dweight = dweight + grad[r] * normed[r]  # rounded to the weight's dtype at every step
        return grad * weight, dweight


def weight_grad_by_atomics(x, weight, *, eps):
    wide = x.float()
    normed = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return ScaleWithGradInRunOrder.apply(normed, weight)


# --- rows that break the op's contract: each becomes its row's one-line reason ----------------------------

def wrong_shape(x, weight, *, eps):
    return rms_norm(x, weight, eps=eps)[:, :-1]


def wrong_dtype(x, weight, *, eps):
    return rms_norm(x, weight, eps=eps).float()


def wrong_device(x, weight, *, eps):
    return rms_norm(x, weight, eps=eps).to("meta")


def raises(x, weight, *, eps):
    raise RuntimeError("kernel launch failed")


def not_a_tensor(x, weight, *, eps):
    return rms_norm(x, weight, eps=eps).tolist()

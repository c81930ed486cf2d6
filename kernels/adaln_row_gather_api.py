"""`adaln_row_gather(table, ti, tag)`: argument checks and autograd around kernels/adaln_row_gather_kernel.py, and
the custom ops torch.compile captures (kernels/custom_ops.py)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from h3bench.kernels import adaln_row_gather_kernel as K
from h3bench.kernels import checks
from h3bench.kernels.custom_ops import Record, absent, compiling, config_fields, config_of, on_device, require_training


def _check(table, ti, tag, modalities: int, chunks: int) -> None:
    named = {"table": table, "ti": ti, "tag": tag}
    checks.tensors(named)
    checks.same_device(named, "table")
    checks.triton_device("table", table)
    checks.float_dtype("table", table)
    checks.index_dtype("ti", ti)
    checks.index_dtype("tag", tag)
    if isinstance(modalities, bool) or not isinstance(modalities, int) or modalities < 1:
        raise ValueError(f"modalities must be an int >= 1, got {modalities!r}")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= K.MAX_CHUNKS:
        raise ValueError(f"chunks must be an int in [1, {K.MAX_CHUNKS}], got {chunks!r}")
    if table.dim() != 2:
        raise ValueError(f"table must be [T * modalities, chunks * H], got shape {tuple(table.shape)}")
    rows, width = table.shape
    if rows == 0 or rows % modalities:
        raise ValueError(f"table must have T * {modalities} rows (timesteps x modalities, T >= 1), got {rows}")
    if width == 0 or width % chunks:
        raise ValueError(f"table must have {chunks} * H columns (H >= 1), got {width}")
    if ti.dim() != 1:
        raise ValueError(f"ti must be 1-D [S], got shape {tuple(ti.shape)}")
    if tag.shape != ti.shape:
        raise ValueError(f"tag must have the shape of ti {tuple(ti.shape)}, got {tuple(tag.shape)}")


def _rows_layout(table: torch.Tensor, ti: torch.Tensor, tag: torch.Tensor):
    """Unit inner stride for the table (row-strided views pass), contiguous indices."""
    table = table if table.stride(1) == 1 else table.contiguous()
    return table, ti if ti.stride(0) == 1 else ti.contiguous(), tag if tag.stride(0) == 1 else tag.contiguous()


def _grad_rows(g: torch.Tensor) -> torch.Tensor:
    return g if g.stride(-1) == 1 else g.contiguous()


class _AdaLNRowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, ti, tag, modalities, chunks, config):
        table_, ti_, tag_ = _rows_layout(table, ti, tag)
        buf, idx = K.forward(table_, ti_, tag_, modalities, chunks, save_index=True, config=config)
        ctx.idx = idx  # an intermediate, not an input or output: no version check needed
        ctx.table_rows, ctx.hidden, ctx.dtype = table.shape[0], table.shape[1] // chunks, table.dtype
        ctx.config = config
        return buf.unbind(0)

    @staticmethod
    def backward(ctx, *grads):
        dtable = K.backward([_grad_rows(g) for g in grads], ctx.idx, ctx.table_rows, ctx.hidden, ctx.dtype,
                            ctx.config)
        return dtable, None, None, None, None, None


def adaln_row_gather(table: torch.Tensor, ti: torch.Tensor, tag: torch.Tensor, modalities: int = 3,
                     chunks: int = 6, check_index: bool = True, config: Optional[K.LaunchConfig] = None
                     ) -> tuple[torch.Tensor, ...]:
    """table[ti * modalities + tag].chunk(chunks, dim=1): `chunks` [S, H] outputs, with the table's gradient.

    table: [T * modalities, chunks * H] bf16/fp16/fp32, any row stride; ti, tag: [S] int32/int64 with ti
    in [0, T) and tag in [0, modalities). The outputs are contiguous (slices of one [chunks, S, H] buffer)
    and bitwise equal to index_select's. The table gradient is summed in a fixed order without atomics
    (kernels/adaln_row_gather_kernel.py). `check_index=False` skips the range check (a host sync); a row with
    an index out of range then comes out as NaN and adds nothing to the gradient.
    """
    if compiling():  # torch.compile captures the custom ops (below)
        return _traced(table, ti, tag, modalities, chunks, check_index, config)
    _check(table, ti, tag, modalities, chunks)
    if table.device.type == "cuda" and table.device.index != torch.cuda.current_device():
        with torch.cuda.device(table.device):  # triton launches on the current device
            return adaln_row_gather(table, ti, tag, modalities, chunks, check_index, config)
    if check_index:
        _check_index(ti, tag, table.shape[0] // modalities, modalities)
    if torch.is_grad_enabled() and table.requires_grad:
        return _AdaLNRowGather.apply(table, ti, tag, modalities, chunks, config)
    buf, _ = K.forward(*_rows_layout(table, ti, tag), modalities, chunks, save_index=False, config=config)
    return buf.unbind(0)


def _check_index(ti: Tensor, tag: Tensor, steps: int, modalities: int) -> None:
    checks.index_range("ti", ti, steps)  # one host sync each
    checks.index_range("tag", tag, modalities)


# --- the custom ops torch.compile captures (kernels/custom_ops.py) ----------------------------------------

def _traced(table: Tensor, ti: Tensor, tag: Tensor, modalities: int = 3, chunks: int = 6, check_index: bool = True,
            config: Optional[K.LaunchConfig] = None) -> tuple[Tensor, ...]:
    """The call as a traced graph holds it: the forward op, in the mode the eager call would take, its buffer
    unbound into the outputs."""
    training = torch.is_grad_enabled() and table.requires_grad
    return _op(table, ti, tag, modalities, chunks, check_index, config_fields(config), training)[0].unbind(0)


@torch.library.custom_op("h3bench::adaln_row_gather", mutates_args=())
def _op(table: Tensor, ti: Tensor, tag: Tensor, modalities: int, chunks: int, check_index: bool, config: list[int],
        training: bool) -> tuple[Tensor, Tensor]:
    """(the [chunks, S, H] buffer of the eager call's outputs, with `training` the combined index the backward
    op needs, else an empty one); config: `config_fields`."""
    with on_device(table):
        if check_index:
            _check_index(ti, tag, table.shape[0] // modalities, modalities)
        buf, idx = K.forward(*_rows_layout(table, ti, tag), modalities, chunks, save_index=training,
                             config=config_of(K.LaunchConfig, config))
    return buf, absent(ti, torch.int32) if idx is None else idx


@_op.register_fake
def _fake(table, ti, tag, modalities, chunks, check_index, config, training):
    _check(table, ti, tag, modalities, chunks)
    rows = ti.shape[0]
    buf = table.new_empty((chunks, rows, table.shape[1] // chunks))
    return buf, ti.new_empty((rows,), dtype=torch.int32) if training else absent(ti, torch.int32)


@torch.library.custom_op("h3bench::adaln_row_gather_backward", mutates_args=())
def _backward_op(grads: Tensor, idx: Tensor, table_rows: int, hidden: int, dtype: torch.dtype, config: list[int]
                 ) -> Tensor:
    """The table's gradient from the outputs' (`grads`: [chunks, S, H]): `_AdaLNRowGather.backward` on the ctx
    its forward filled."""
    ctx = Record(idx=idx, table_rows=table_rows, hidden=hidden, dtype=dtype, config=config_of(K.LaunchConfig, config))
    with on_device(idx):
        return _AdaLNRowGather.backward(ctx, *grads.unbind(0))[0]


@_backward_op.register_fake
def _backward_fake(grads, idx, table_rows, hidden, dtype, config):
    return grads.new_empty((table_rows, grads.shape[0] * hidden), dtype=dtype)


def _setup(ctx, inputs, output) -> None:
    table, _, _, _, chunks, _, ctx.config, ctx.training = inputs
    ctx.table_rows, ctx.hidden, ctx.dtype = table.shape[0], table.shape[1] // chunks, table.dtype
    ctx.save_for_backward(output[1])


def _backward(ctx, grads, _):
    require_training(ctx, "adaln_row_gather")
    (idx,) = ctx.saved_tensors
    dtable = _backward_op(grads, idx, ctx.table_rows, ctx.hidden, ctx.dtype, ctx.config)
    return dtable, None, None, None, None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)

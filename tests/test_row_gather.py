"""kernels/row_gather.py: table[idx] with a fixed-order, atomic-free backward."""
import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels.row_gather import deterministic_row_gather
from tests.helpers import STRIDED

TOL = {torch.bfloat16: 4.5e-3, torch.float16: 1e-3, torch.float32: 1e-6}


def inputs(device, hidden, rows, dtype=torch.bfloat16, table_rows=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(table_rows, 6 * hidden, generator=gen).to(dtype).to(device)
    table = base.chunk(6, dim=-1)[1]  # a strided view, as the AdaLN tables are
    idx = torch.randint(0, table_rows, (rows,), generator=gen).to(device)
    grads = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    return table, idx, grads


def gather(table, idx, grads):
    leaf = table.detach().requires_grad_()
    rows = deterministic_row_gather(leaf, idx)
    rows.backward(grads)
    return rows.detach(), leaf.grad


@pytest.mark.parametrize("hidden,rows,dtype", [(8, 40, torch.bfloat16), (257, 30, torch.float32),
                                               (64, 100, torch.float16), (2048, 12, torch.bfloat16)])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_forward_is_index_select_and_backward_matches_float64(device, hidden, rows, dtype, index_dtype):
    table, idx, grads = inputs(device, hidden, rows, dtype)
    out, dtable = gather(table, idx.to(index_dtype), grads)
    assert torch.equal(as_bits(out), as_bits(table.index_select(0, idx)))
    ref = torch.zeros(table.shape, dtype=torch.float64, device=device).index_add_(0, idx, grads.double())
    assert dtable.dtype == dtype and dtable.shape == table.shape
    assert rel_err(dtable, ref) <= TOL[dtype]


def test_backward_repeats_bitwise_and_unused_rows_get_zero(device):
    table, idx, grads = inputs(device, 48, 200)
    idx[idx == 5] = 4  # table row 5 is never gathered
    first = gather(table, idx, grads)[1]
    second = gather(table, idx, grads)[1]
    assert torch.equal(as_bits(first), as_bits(second))
    assert torch.count_nonzero(first[5]) == 0 and torch.count_nonzero(first[4]) > 0


@pytest.mark.parametrize("layout", STRIDED)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_strided_inputs_give_the_contiguous_bits(device, layout, index_dtype):
    """table, idx and the row gradients as strided views (NaN or an out-of-range index between their
    elements): rows and table gradient bitwise those of contiguous inputs (a strided idx was once read at
    unit stride by the backward's sort)."""
    table, idx, grads = inputs(device, 7, 13)
    idx = idx.to(index_dtype)
    out, dtable = gather(table.contiguous(), idx, grads)
    view = STRIDED[layout]
    s_table, s_idx, s_grads = view(table), view(idx), view(grads)
    assert s_idx.stride(0) == 2 and torch.equal(s_idx, idx) and torch.equal(s_table, table)
    s_out, s_dtable = gather(s_table, s_idx, s_grads)
    assert torch.equal(as_bits(s_out), as_bits(out)) and torch.equal(as_bits(s_dtable), as_bits(dtable))


def test_zero_rows(device):
    table, idx, grads = inputs(device, 8, 0)
    out, dtable = gather(table, idx, grads)
    assert out.shape == (0, 8) and torch.count_nonzero(dtable) == 0


@pytest.mark.parametrize("table,idx,error,match", [
    (torch.zeros(8), torch.zeros(2, dtype=torch.long), ValueError, "table must be"),
    (torch.zeros(3, 8), torch.zeros(2), TypeError, "idx must be"),
    (torch.zeros(3, 8), torch.zeros(2, 1, dtype=torch.long), TypeError, "idx must be"),
    (torch.zeros(3, 8), torch.zeros(2, dtype=torch.long, device="meta"), ValueError, "idx is on meta"),
])
def test_bad_input(table, idx, error, match):
    with pytest.raises(error, match=match):
        deterministic_row_gather(table, idx)

"""Our Triton adaln_row_gather (kernels/adaln_row_gather_kernel.py) against index_select and float64, its
invariance, its table gradient's order, and its argument errors."""
import dataclasses

import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels import adaln_row_gather_kernel as K
from h3bench.kernels import common
from h3bench.kernels.adaln_row_gather_api import adaln_row_gather
from tests.helpers import STRIDED, run_quick_plan

# max|err|/max|ref| of the table gradient: fp32 sums rounded once, and one rounding of an element costs at
# most 2^-8 of it in bf16, 2^-11 in fp16 (the margin covers the fp32 accumulation); fp32 only accumulates.
TOL = {torch.bfloat16: 2 ** -8 + 1e-5, torch.float16: 2 ** -11 + 1e-5, torch.float32: 2e-5}


def case(device, hidden, rows, dtype=torch.bfloat16, seed=0, index_dtype=torch.int64, wide=True):
    """A [9, 6H] table as a row-strided view (the columns of a wider [9, 8H] tensor) unless `wide` is False,
    the RFC's layout of ti and tag, and six upstream gradients."""
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn(9, 8 * hidden, generator=gen) * 0.1).to(dtype).to(device)
    table = base[:, hidden:7 * hidden] if wide else base[:, :6 * hidden].contiguous()
    ti = torch.randint(0, 3, (rows,), generator=gen).to(index_dtype).to(device)
    tag = torch.randint(0, 3, (rows,), generator=gen).to(index_dtype).to(device)
    grads = [torch.randn(rows, hidden, generator=gen).to(dtype).to(device) for _ in range(6)]
    return table, ti, tag, grads


def run(table, ti, tag, grads, **kw):
    leaf = table.detach().requires_grad_()
    outs = adaln_row_gather(leaf, ti, tag, **kw)
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs], leaf.grad


def reference(table, ti, tag, grads):
    idx = ti.long() * 3 + tag.long()
    outs = table.index_select(0, idx).chunk(6, dim=1)
    dt = torch.zeros(table.shape, dtype=torch.float64, device=table.device)
    dt.index_add_(0, idx, torch.cat([g.double() for g in grads], dim=1))
    return outs, dt


@pytest.mark.parametrize("hidden,rows,dtype,index_dtype", [
    (64, 300, torch.bfloat16, torch.int64),
    (3, 300, torch.float16, torch.int32),
    (1, 7, torch.float32, torch.int64),
    (257, 7, torch.bfloat16, torch.int32),
    (2000, 1, torch.bfloat16, torch.int64),
    (8, 0, torch.bfloat16, torch.int64),
])
def test_forward_is_index_select_and_gradient_matches_float64(device, hidden, rows, dtype, index_dtype):
    table, ti, tag, grads = case(device, hidden, rows, dtype, index_dtype=index_dtype)
    assert not table.is_contiguous()
    outs, dtable = run(table, ti, tag, grads)
    ref_outs, ref_dt = reference(table, ti, tag, grads)
    assert len(outs) == 6
    for out, ref in zip(outs, ref_outs):
        assert out.shape == (rows, hidden) and out.dtype == dtype and out.is_contiguous()
        assert torch.equal(as_bits(out), as_bits(ref))
    assert dtable.shape == table.shape and dtable.dtype == dtype
    if rows:
        assert rel_err(dtable, ref_dt) <= TOL[dtype]
    else:
        assert torch.count_nonzero(dtable) == 0


def test_inference_path_and_dense_table_agree(device):
    table, ti, tag, grads = case(device, 24, 40)
    outs, _ = run(table, ti, tag, grads)
    with torch.no_grad():
        plain = adaln_row_gather(table, ti, tag)
    dense = adaln_row_gather(table.contiguous(), ti[::1].clone(), tag)
    for a, b, c in zip(outs, plain, dense):
        assert torch.equal(as_bits(a), as_bits(b)) and torch.equal(as_bits(a), as_bits(c))


def test_non_contiguous_indices_and_gradients(device):
    table, ti, tag, grads = case(device, 16, 40)
    ti2, tag2 = torch.stack([ti, ti]).t().reshape(-1)[::2], tag.repeat_interleave(2)[::2]  # stride-2 views
    assert ti2.stride(0) == 2 and torch.equal(ti2, ti)
    wide = [torch.cat([g, g], dim=1)[:, 16:] for g in grads]  # row stride 2H
    outs, dtable = run(table, ti2, tag2, wide)
    ref_outs, ref_dt = reference(table, ti, tag, grads)
    assert all(torch.equal(o, r) for o, r in zip(outs, ref_outs))
    assert rel_err(dtable, ref_dt) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("layout", STRIDED)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_strided_inputs_give_the_contiguous_bits(device, layout, index_dtype):
    """table, ti, tag and the six upstream gradients as strided views (NaN or an out-of-range index
    between the elements): outputs, table gradient and the no-grad outputs bitwise those of contiguous
    inputs."""
    table, ti, tag, grads = case(device, 7, 13, index_dtype=index_dtype)
    table = table.contiguous()
    outs, dtable = run(table, ti, tag, grads)
    view = STRIDED[layout]
    s_table, s_ti, s_tag = view(table), view(ti), view(tag)
    assert s_ti.stride(0) == 2 and torch.equal(s_ti, ti) and torch.equal(s_tag, tag) and torch.equal(s_table, table)
    s_outs, s_dtable = run(s_table, s_ti, s_tag, [view(g) for g in grads])
    assert torch.equal(as_bits(s_dtable), as_bits(dtable))
    with torch.no_grad():
        plain = adaln_row_gather(s_table, s_ti, s_tag)
    for a, b, c in zip(s_outs, plain, outs):
        assert torch.equal(as_bits(a), as_bits(c)) and torch.equal(as_bits(b), as_bits(c))


def test_row_alone_equals_row_in_batch(device):
    table, ti, tag, grads = case(device, 40, 70)
    outs, _ = run(table, ti, tag, grads)
    for r in (0, 1, 33, 69):
        alone, _ = run(table, ti[r:r + 1], tag[r:r + 1], [g[r:r + 1] for g in grads])
        for a, b in zip(alone, outs):
            assert torch.equal(as_bits(a[0]), as_bits(b[r]))


def test_table_gradient_repeats_bitwise_and_unused_rows_get_zero(device):
    table, ti, tag, grads = case(device, 24, 90)
    ti[(ti == 1) & (tag == 2)] = 0  # table row 5 is never gathered
    first = run(table, ti, tag, grads)[1]
    second = run(table, ti, tag, grads)[1]
    assert torch.equal(as_bits(first), as_bits(second))
    assert torch.count_nonzero(first[5]) == 0 and torch.count_nonzero(first[4]) > 0


def test_many_programs_and_sorts_agree_with_float64(device, monkeypatch):
    """Small chunks and sorts: programs that hold no row of some table row, or only bad-index rows, still
    write their (zero) partials; sub-chunked sorts keep each table row's rows in ascending order; the
    cross-program sum stays fp32-accurate. The GPU's tile shapes (not the interpreter's) are used, and one
    SM: the split follows the SM count, and with a whole GPU's 60 rows would be one row per program."""
    monkeypatch.setattr(common, "sm_count", lambda index: 1)
    table, ti, tag, grads = case(device, 24, 60, torch.float32)
    gpu = K.config_for(24, interpreted=False)
    small = dataclasses.replace(gpu, chunk_limit=12, sort_rows=4, fwd_tiles=2)
    programs, chunk, sort, subs = K.backward_split(60, 24, 6, small, device)
    assert programs >= 5 and subs >= 3
    ti[7] = 3  # a bad row: NaN outputs, nothing in the gradient
    outs, dtable = run(table, ti, tag, grads, check_index=False, config=small)
    good = torch.ones(60, dtype=torch.bool, device=device)
    good[7] = False
    ref_outs, ref_dt = reference(table, ti[good], tag[good], [g[good] for g in grads])
    for out, ref in zip(outs, ref_outs):
        assert torch.isnan(out[7]).all() and torch.equal(out[good], ref)
    assert rel_err(dtable, ref_dt) <= TOL[torch.float32]
    again = run(table, ti, tag, grads, check_index=False, config=small)[1]
    assert torch.equal(as_bits(dtable), as_bits(again))


def test_out_of_range_index(device):
    table, ti, tag, grads = case(device, 8, 5)
    bad = ti.clone()
    bad[3] = 3
    with pytest.raises(IndexError, match=r"ti\[3\] = 3 is outside \[0, 3\)"):
        adaln_row_gather(table, bad, tag)
    bad_tag = tag.clone()
    bad_tag[2] = -1
    with pytest.raises(IndexError, match=r"tag\[2\] = -1 is outside \[0, 3\)"):
        adaln_row_gather(table, ti, bad_tag)
    outs, dtable = run(table, bad, bad_tag, grads, check_index=False)
    for out in outs:
        assert torch.isnan(out[[2, 3]]).all() and torch.isfinite(out[[0, 1, 4]]).all()
    keep = torch.tensor([0, 1, 4], device=device)
    _, ref_dt = reference(table, ti[keep], tag[keep], [g[keep] for g in grads])
    assert rel_err(dtable, ref_dt) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {"table": a["table"].tolist()}, TypeError, "table must be a torch.Tensor"),
    (lambda a: {"ti": a["ti"].float()}, TypeError, "ti has dtype"),
    (lambda a: {"tag": a["tag"].to(torch.int16)}, TypeError, "tag has dtype"),
    (lambda a: {"table": a["table"].to(torch.int32)}, TypeError, "table has dtype"),
    (lambda a: {"tag": a["tag"].to("meta")}, ValueError, "tag is on meta"),
    (lambda a: {"table": a["table"][:8]}, ValueError, "table must have T \\* 3 rows"),
    (lambda a: {"table": a["table"][:, :-1]}, ValueError, "table must have 6 \\* H columns"),
    (lambda a: {"table": a["table"][0]}, ValueError, "table must be"),
    (lambda a: {"ti": a["ti"][:, None]}, ValueError, "ti must be 1-D"),
    (lambda a: {"tag": a["tag"][:-1]}, ValueError, "tag must have the shape of ti"),
    (lambda a: {"modalities": 0}, ValueError, "modalities must be"),
    (lambda a: {"chunks": 7}, ValueError, "chunks must be"),
])
def test_bad_input_names_the_argument(device, change, error, match):
    table, ti, tag, _ = case(device, 8, 5)
    args = {"table": table, "ti": ti, "tag": tag, "modalities": 3, "chunks": 6}
    args.update(change(args))
    with pytest.raises(error, match=match):
        adaln_row_gather(args["table"], args["ti"], args["tag"], args["modalities"], args["chunks"])


def test_quick_plan_through_the_runner(device):
    from h3bench.adapters.adaln_row_gather.h3bench_triton import ADAPTER

    row = run_quick_plan("adaln_row_gather", ADAPTER, device)  # batch-invariant, table gradient repeatable
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err == 0.0  # a copy
        assert size.grad_rel_err["table"] <= TOL[torch.bfloat16]

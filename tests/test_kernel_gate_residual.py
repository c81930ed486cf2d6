"""Our Triton gate_residual (kernels/gate_residual_kernel.py) against float64, its invariance, its gate
gradient's order, and its argument errors."""
import dataclasses

import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels import gate_residual_kernel as K
from h3bench.kernels.gate_residual_api import gate_residual
from tests.helpers import STRIDED, run_quick_plan

# max|err|/max|ref|: every output is rounded once from fp32, which costs at most 2^-8 of the element in
# bf16 and 2^-11 in fp16 (the margin covers the fp32 sum of the gate gradient and, for out, the fp32
# rounding of res + g * y); in fp32 only the arithmetic rounds.
TOL = {torch.bfloat16: 2 ** -8 + 1e-5, torch.float16: 2 ** -11 + 1e-5, torch.float32: 2e-6}
NAMES = ("res", "y", "gate")


def case(device, hidden, rows, dtype=torch.bfloat16, seed=0, index_dtype=torch.int64):
    """res a row-strided view (columns of a wider tensor), y contiguous, gate a column chunk of a [9, 6H]
    table (as in the model), the RFC-like index, and an upstream gradient."""
    gen = torch.Generator().manual_seed(seed)
    res = torch.randn(rows, 2 * hidden, generator=gen).to(dtype).to(device)[:, hidden:]
    y = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    table = (torch.randn(9, 6 * hidden, generator=gen) * 0.1).to(dtype).to(device)
    gate = table.chunk(6, dim=1)[2]
    idx = torch.randint(0, 9, (rows,), generator=gen).to(index_dtype).to(device)
    dout = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    return {"res": res, "y": y, "gate": gate, "idx": idx}, dout


def run(t, dout, **kw):
    leaves = {n: t[n].detach().requires_grad_() for n in NAMES}
    out = gate_residual(leaves["res"], leaves["y"], leaves["gate"], t["idx"], **kw)
    out.backward(dout)
    return out.detach(), {n: leaves[n].grad for n in NAMES}


def reference(t, dout):
    leaves = {n: t[n].double().requires_grad_() for n in NAMES}
    out = leaves["res"] + leaves["gate"].index_select(0, t["idx"].long()) * leaves["y"]
    out.backward(dout.double())
    return out.detach(), {n: leaves[n].grad for n in NAMES}


@pytest.mark.parametrize("hidden,rows,dtype,index_dtype", [
    (64, 300, torch.bfloat16, torch.int64),
    (3, 300, torch.float16, torch.int32),
    (1, 7, torch.float32, torch.int64),
    (257, 7, torch.bfloat16, torch.int32),
    (2000, 1, torch.bfloat16, torch.int64),
])
def test_matches_float64(device, hidden, rows, dtype, index_dtype):
    t, dout = case(device, hidden, rows, dtype, index_dtype=index_dtype)
    assert t["res"].stride(0) == 2 * hidden and t["gate"].stride(0) == 6 * hidden  # row-strided views
    out, grads = run(t, dout)
    ref, ref_grads = reference(t, dout)
    assert out.shape == (rows, hidden) and out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]
    assert torch.equal(as_bits(grads["res"]), as_bits(dout))  # dres = dy, bit for bit
    for name in ("y", "gate"):
        assert grads[name].shape == t[name].shape and grads[name].dtype == dtype
        assert rel_err(grads[name], ref_grads[name]) <= TOL[dtype], name


BF, HF, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize("res_dtype,y_dtype,gate_dtype", [
    (F32, BF, BF), (BF, F32, BF), (BF, BF, F32), (HF, BF, BF), (F32, HF, F32), (BF, HF, HF)])
def test_mixed_dtypes_match_float64(device, res_dtype, y_dtype, gate_dtype):
    """res, y and gate each in its own dtype (an fp32 residual stream with a bf16 branch, say): out in the
    promoted dtype as torch's composition gives, each gradient in its input's dtype, every one within its
    dtype's rounding of float64; dres is dout itself where res's dtype is out's."""
    t, dout = case(device, 40, 33)
    t = {**t, "res": t["res"].to(res_dtype), "y": t["y"].to(y_dtype), "gate": t["gate"].to(gate_dtype)}
    want = (t["res"] + t["gate"].index_select(0, t["idx"]) * t["y"]).dtype
    dout = dout.to(want)
    out, grads = run(t, dout)
    ref, ref_grads = reference(t, dout)
    assert out.dtype == want and rel_err(out, ref) <= TOL[want]
    for name in NAMES:
        assert grads[name].dtype == t[name].dtype, name
        assert rel_err(grads[name], ref_grads[name]) <= TOL[t[name].dtype] + TOL[want], name
    if res_dtype == want:
        assert torch.equal(as_bits(grads["res"]), as_bits(dout))
    else:
        assert torch.equal(as_bits(grads["res"]), as_bits(dout.to(res_dtype)))  # one rounding, to nearest
    # invariance holds in every dtype combination: a row alone gives the batch's bits
    one, one_grads = run({**t, **{n: t[n][3:4] for n in ("res", "y")}, "idx": t["idx"][3:4]}, dout[3:4])
    assert torch.equal(as_bits(one[0]), as_bits(out[3]))
    assert torch.equal(as_bits(one_grads["y"][0]), as_bits(grads["y"][3]))


def test_zero_rows(device):
    t, dout = case(device, 8, 0)
    out, grads = run(t, dout)
    assert out.shape == (0, 8) and grads["y"].shape == (0, 8)
    assert grads["gate"].shape == (9, 8) and torch.count_nonzero(grads["gate"]) == 0


def test_leading_dims_transposed_input_and_inference(device):
    t, dout = case(device, 16, 12)
    flat_out, flat_grads = run(t, dout)
    y_t = t["y"].t().contiguous().t()  # same values, inner stride != 1: copied by the wrapper
    assert y_t.stride(-1) != 1
    three = {"res": t["res"].reshape(3, 4, 16), "y": y_t.reshape(3, 4, 16), "gate": t["gate"],
             "idx": t["idx"].reshape(3, 4)}
    out, grads = run(three, dout.reshape(3, 4, 16))
    assert out.shape == (3, 4, 16) and torch.equal(as_bits(out.reshape(12, 16)), as_bits(flat_out))
    for name in ("res", "y"):
        assert torch.equal(as_bits(grads[name].reshape(12, 16)), as_bits(flat_grads[name]))
    assert torch.equal(as_bits(grads["gate"]), as_bits(flat_grads["gate"]))
    with torch.no_grad():
        plain = gate_residual(t["res"], t["y"], t["gate"].contiguous(), t["idx"])
    assert torch.equal(as_bits(plain), as_bits(flat_out))


@pytest.mark.parametrize("layout", STRIDED)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_strided_inputs_give_the_contiguous_bits(device, layout, index_dtype):
    """Every argument and the upstream gradient a strided view (NaN or an out-of-range index between the
    elements): output, gradients and the no-grad output bitwise those of contiguous inputs."""
    t, dout = case(device, 7, 13, index_dtype=index_dtype)
    dense = {n: v.contiguous() for n, v in t.items()}
    out, grads = run(dense, dout)
    strided = {n: STRIDED[layout](v) for n, v in dense.items()}
    assert strided["idx"].stride(0) == 2 and all(torch.equal(strided[n], dense[n]) for n in dense)
    s_out, s_grads = run(strided, STRIDED[layout](dout))
    assert torch.equal(as_bits(s_out), as_bits(out))
    for name in NAMES:
        assert torch.equal(as_bits(s_grads[name]), as_bits(grads[name])), name
    with torch.no_grad():
        assert torch.equal(as_bits(gate_residual(*strided.values())), as_bits(out))


def test_row_alone_equals_row_in_batch(device):
    t, dout = case(device, 40, 70)
    out, grads = run(t, dout)
    for r in (0, 1, 33, 69):
        one = {n: (v[r:r + 1] if n != "gate" else v) for n, v in t.items()}
        out1, g1 = run(one, dout[r:r + 1])
        assert torch.equal(as_bits(out1[0]), as_bits(out[r]))
        for name in ("res", "y"):
            assert torch.equal(as_bits(g1[name][0]), as_bits(grads[name][r])), name


def test_gate_gradient_repeats_bitwise_and_unused_rows_get_zero(device):
    t, dout = case(device, 24, 90)
    t["idx"][t["idx"] == 5] = 4  # table row 5 is never used
    first = run(t, dout)[1]["gate"]
    second = run(t, dout)[1]["gate"]
    assert torch.equal(as_bits(first), as_bits(second))
    assert torch.count_nonzero(first[5]) == 0 and torch.count_nonzero(first[4]) > 0


@pytest.mark.parametrize("bwd_block_c", [None, 8, 32])
def test_many_programs_agree_with_float64(device, bwd_block_c):
    """Small chunks and narrow column blocks on the GPU's tile shapes: programs that hold no row of some
    table row, or only bad-index rows, still write their (zero) partials; the cross-program sum stays
    fp32-accurate; dres is dy; the backward's column blocks may differ from the forward's (narrower, or
    one block wider than H)."""
    t, dout = case(device, 24, 60, torch.float32)
    gpu = K.config_for(24, interpreted=False)
    small = dataclasses.replace(gpu, block_c=16, chunk_limit=12, fwd_tiles=2, bwd_block_c=bwd_block_c)
    programs, _ = K.backward_split(60, 24, small, device)
    assert programs >= 5
    t["idx"][7] = 9  # a bad row
    out, grads = run(t, dout, check_index=False, config=small)
    good = torch.ones(60, dtype=torch.bool, device=device)
    good[7] = False
    sub = {n: (v[good] if n != "gate" else v) for n, v in t.items()}
    ref, ref_grads = reference(sub, dout[good])
    assert torch.isnan(out[7]).all() and torch.isnan(grads["y"][7]).all()
    assert rel_err(out[good], ref) <= TOL[torch.float32]
    assert torch.equal(as_bits(grads["res"]), as_bits(dout))
    for name in ("y", "gate"):
        got = grads[name][good] if name == "y" else grads[name]
        assert rel_err(got, ref_grads[name]) <= TOL[torch.float32], name
    again = run(t, dout, check_index=False, config=small)[1]["gate"]
    assert torch.equal(as_bits(grads["gate"]), as_bits(again))


def test_the_gpu_default_for_wide_rows_agrees_with_float64(device):
    """From H = 512 up the GPU default steps the backward through 512 columns and 4 sorted rows at a time,
    wider than the forward's 256-column tiles: with H = 600 the second column block is partial."""
    t, dout = case(device, 600, 20, torch.float32)
    gpu = K.config_for(600, interpreted=False)
    assert (gpu.bwd_block_c, gpu.bwd_rows, gpu.block_c) == (512, 4, 256)
    out, grads = run(t, dout, config=gpu)
    ref, ref_grads = reference(t, dout)
    assert rel_err(out, ref) <= TOL[torch.float32]
    for name in ("y", "gate"):
        assert rel_err(grads[name], ref_grads[name]) <= TOL[torch.float32], name
    assert torch.equal(as_bits(run(t, dout, config=gpu)[1]["gate"]), as_bits(grads["gate"]))


def test_out_of_range_index(device):
    t, dout = case(device, 8, 5)
    bad = dict(t)
    bad["idx"] = t["idx"].clone()
    bad["idx"][3] = 9
    with pytest.raises(IndexError, match=r"idx\[3\] = 9 is outside \[0, 9\)"):
        gate_residual(bad["res"], bad["y"], bad["gate"], bad["idx"])
    bad["idx"][3] = -1
    with pytest.raises(IndexError, match="-1"):
        gate_residual(bad["res"], bad["y"], bad["gate"], bad["idx"])
    out = gate_residual(bad["res"], bad["y"], bad["gate"], bad["idx"], check_index=False)
    assert torch.isnan(out[3]).all() and torch.isfinite(out[[0, 1, 2, 4]]).all()


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {"res": a["res"].tolist()}, TypeError, "res must be a torch.Tensor"),
    (lambda a: {"y": a["y"].double()}, TypeError, "y has dtype"),
    (lambda a: {"gate": a["gate"].int()}, TypeError, "gate has dtype"),
    (lambda a: {"res": a["res"].int(), "y": a["y"].int(), "gate": a["gate"].int()}, TypeError, "res has dtype"),
    (lambda a: {"idx": a["idx"].float()}, TypeError, "idx has dtype"),
    (lambda a: {"gate": a["gate"].to("meta")}, ValueError, "gate is on meta"),
    (lambda a: {"y": a["y"][:-1]}, ValueError, "y must have the shape of res"),
    (lambda a: {"gate": a["gate"][:, :-1]}, ValueError, "gate must have shape"),
    (lambda a: {"idx": a["idx"][:-1]}, ValueError, "idx must have shape"),
    (lambda a: {"res": a["res"][:, :0], "y": a["y"][:, :0], "gate": a["gate"][:, :0]}, ValueError, "H >= 1"),
    (lambda a: {"gate": a["gate"][:0]}, ValueError, "gate has no table rows"),
])
def test_bad_input_names_the_argument(device, change, error, match):
    t, _ = case(device, 8, 5)
    args = dict(t)
    args.update(change(args))
    with pytest.raises(error, match=match):
        gate_residual(args["res"], args["y"], args["gate"], args["idx"])


def test_quick_plan_through_the_runner(device):
    from h3bench.adapters.gate_residual.h3bench_triton import ADAPTER

    row = run_quick_plan("gate_residual", ADAPTER, device)  # batch-invariant, gate gradient repeatable
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= TOL[torch.bfloat16]
        assert size.grad_rel_err["res"] == 0.0  # dres = dy exactly
        assert max(size.grad_rel_err.values()) <= TOL[torch.bfloat16]

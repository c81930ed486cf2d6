"""Our Triton norm_modulate against float64, its invariance, and its argument errors."""
import pytest
import torch
import triton
import triton.language as tl

from harness.execute import as_bits
from harness.ops.norm_modulate import OP, NormModulateParams
from harness.probes.accuracy_latency import rel_err
from kernels.norm_modulate_api import norm_modulate
from kernels.common import local_order
from tests.helpers import nm_params

# max|err|/max|ref| bounds: one rounding of a value near max|ref| costs at most 2^-8 (bf16),
# 2^-11 (fp16); fp32 only accumulates rounding.
TOL = {"bfloat16": 4.5e-3, "float16": 1e-3, "float32": 2e-5}
NAMES = ("x", "w", "sh", "sc")


def case(device, hidden, rows, dtype="bfloat16", seed=3):
    params = nm_params(hidden, dtype)
    inputs = OP.make_inputs(params, rows, seed, device)
    return params, inputs, OP.make_grad_outs(params, rows, seed + 100, device)[0]


def reference(params, inputs, grad_out):
    return OP.reference(params, inputs, (grad_out,), NAMES, OP.name)


def run(inputs, grad_out, idx=None, x=None):
    t = inputs.tensors
    leaves = [(x if (n == "x" and x is not None) else t[n]).detach().requires_grad_() for n in NAMES]
    y = norm_modulate(*leaves, t["idx"] if idx is None else idx)
    y.backward(grad_out.reshape(y.shape))
    return y.detach(), {n: l.grad for n, l in zip(NAMES, leaves)}


@pytest.mark.parametrize("hidden,rows,dtype", [
    (8, 37, "bfloat16"), (64, 130, "float32"), (3, 9, "float16"), (257, 20, "bfloat16"),
    (2, 11, "float32"), (100, 7, "float16"),
])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_matches_float64(device, hidden, rows, dtype, index_dtype):
    params, inputs, grad_out = case(device, hidden, rows, dtype)
    assert inputs.tensors["sh"].stride() == (6 * hidden, 1), "tables must be strided views"
    y, grads = run(inputs, grad_out, idx=inputs.tensors["idx"].to(index_dtype))
    ref = reference(params, inputs, grad_out)
    assert y.dtype == params.torch_dtype and y.shape == (rows, hidden)
    assert rel_err(y, ref.outputs[0]) <= TOL[dtype]
    for name in NAMES:
        assert grads[name].shape == inputs.tensors[name].shape
        assert rel_err(grads[name], ref.grads[name]) <= TOL[dtype] * 1.2, name


def test_hidden_one(device):
    # H = 1: y = sign(x) * w * (1 + sc) + sh up to eps; dx is a cancellation of near-equal terms, so
    # it is checked against an absolute bound instead.
    params, inputs, grad_out = case(device, 1, 9, "float32")
    y, grads = run(inputs, grad_out)
    ref = reference(params, inputs, grad_out)
    assert rel_err(y, ref.outputs[0]) <= 1e-6
    assert (grads["x"].double() - ref.grads["x"]).abs().max() <= 1e-4
    for name in ("w", "sh", "sc"):
        assert rel_err(grads[name], ref.grads[name]) <= 1e-5


def test_leading_dims_and_contiguous_tables(device):
    params, inputs, grad_out = case(device, 16, 12)
    t = inputs.tensors
    x3 = t["x"].reshape(3, 4, 16)
    y, grads = run(inputs, grad_out, idx=t["idx"].reshape(3, 4), x=x3)
    flat, flat_grads = run(inputs, grad_out)
    assert y.shape == (3, 4, 16) and torch.equal(as_bits(y.reshape(12, 16)), as_bits(flat))
    assert torch.equal(as_bits(grads["x"].reshape(12, 16)), as_bits(flat_grads["x"]))
    dense = {"sh": t["sh"].contiguous(), "sc": t["sc"].contiguous()}
    y_dense = norm_modulate(t["x"], t["w"], dense["sh"], dense["sc"], t["idx"])
    assert torch.equal(as_bits(y_dense), as_bits(flat)), "strided and dense tables must agree bitwise"


def test_row_alone_equals_row_in_batch(device):
    params, inputs, grad_out = case(device, 40, 70)
    y, grads = run(inputs, grad_out)
    for r in (0, 1, 33, 69):
        sub = inputs.select_rows(torch.tensor([r], device=device))
        y1, g1 = run(sub, grad_out[r:r + 1])
        assert torch.equal(as_bits(y1[0]), as_bits(y[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


def test_parameter_gradients_repeat_bitwise(device):
    params, inputs, grad_out = case(device, 24, 90)
    _, first = run(inputs, grad_out)
    _, second = run(inputs, grad_out)
    for name in ("w", "sh", "sc"):
        assert torch.equal(as_bits(first[name]), as_bits(second[name])), name


def test_table_row_without_rows_gets_zero_gradient(device):
    params, inputs, grad_out = case(device, 8, 6)
    idx = torch.zeros(6, dtype=torch.long, device=device)  # only table row 0 is used
    _, grads = run(inputs, grad_out, idx=idx)
    assert grads["sh"][1:].abs().sum() == 0 and grads["sc"][1:].abs().sum() == 0
    assert grads["sh"][0].abs().sum() > 0


def test_zero_rows(device):
    params, inputs, _ = case(device, 8, 4)
    t = inputs.tensors
    x = t["x"][:0].detach().requires_grad_()
    w = t["w"].detach().requires_grad_()
    y = norm_modulate(x, w, t["sh"], t["sc"], t["idx"][:0])
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 8) and torch.count_nonzero(w.grad) == 0


def test_out_of_range_index(device):
    _, inputs, _ = case(device, 8, 5)
    t = inputs.tensors
    bad = t["idx"].clone()
    bad[3] = 9
    with pytest.raises(IndexError, match=r"idx\[3\] = 9 is outside \[0, 9\)"):
        norm_modulate(t["x"], t["w"], t["sh"], t["sc"], bad)
    bad[3] = -1
    with pytest.raises(IndexError, match="-1"):
        norm_modulate(t["x"], t["w"], t["sh"], t["sc"], bad)
    y = norm_modulate(t["x"], t["w"], t["sh"], t["sc"], bad, check_index=False)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[[0, 1, 2, 4]]).all()


@pytest.mark.parametrize("change,error,match", [
    (lambda t: {"w": t["w"][:-1]}, ValueError, "w must have shape"),
    (lambda t: {"sh": t["sh"][:, :-1]}, ValueError, "sh must have shape"),
    (lambda t: {"sc": t["sc"][:-1]}, ValueError, "same number of table rows"),
    (lambda t: {"idx": t["idx"][:-1]}, ValueError, "idx must have shape"),
    (lambda t: {"w": t["w"].float()}, TypeError, "w has dtype"),
    (lambda t: {"x": t["x"].to(torch.int32)}, TypeError, "x has dtype"),
    (lambda t: {"idx": t["idx"].float()}, TypeError, "idx has dtype"),
    (lambda t: {"sc": t["sc"].to("meta")}, ValueError, "sc is on meta"),
    (lambda t: {"sh": t["sh"].tolist()}, TypeError, "sh must be a torch.Tensor"),
    (lambda t: {"x": t["x"][:, :0], "w": t["w"][:0]}, ValueError, "H >= 1"),
])
def test_bad_input_names_the_argument(device, change, error, match):
    _, inputs, _ = case(device, 8, 5)
    args = {**inputs.tensors}
    args.update(change(args))
    with pytest.raises(error, match=match):
        norm_modulate(args["x"], args["w"], args["sh"], args["sc"], args["idx"])


@pytest.mark.parametrize("hidden,rows", [(2048, 9), (3000, 20), (5376, 6)])
def test_wide_rows_path(device, hidden, rows):
    """H with BLOCK_H >= WIDE_FROM takes the per-row forward and the row-at-a-time backward."""
    from kernels.norm_modulate import launch_config
    assert launch_config(hidden).wide
    params, inputs, grad_out = case(device, hidden, rows)
    y, grads = run(inputs, grad_out)
    ref = reference(params, inputs, grad_out)
    assert rel_err(y, ref.outputs[0]) <= TOL["bfloat16"]
    for name in NAMES:
        assert rel_err(grads[name], ref.grads[name]) <= TOL["bfloat16"] * 1.2, name
    for r in (0, rows - 1):
        sub = inputs.select_rows(torch.tensor([r], device=device))
        y1, g1 = run(sub, grad_out[r:r + 1])
        assert torch.equal(as_bits(y1[0]), as_bits(y[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


@triton.jit
def _local_order_probe(IDX, ORDER, STARTS, COUNTS, n_rows, M, CHUNK, CMAX: tl.constexpr, K_P2: tl.constexpr):
    pid = tl.program_id(0)
    lo = pid * CHUNK
    starts, counts = local_order(IDX, ORDER, pid, lo, tl.minimum(CHUNK, n_rows - lo), M, CMAX, K_P2)
    ks = tl.arange(0, K_P2)
    tl.store(STARTS + pid * K_P2 + ks, starts)
    tl.store(COUNTS + pid * K_P2 + ks, counts)


def test_local_order_is_a_stable_counting_sort_per_chunk(device):
    idx = torch.tensor([3, 0, 3, 9, 1, 0, -2, 3, 1], device=device)  # 9 and -2 are out of range for M=4
    chunk, cmax, k_p2 = 5, 8, 8
    order = torch.full((2 * cmax,), -1, dtype=torch.int32, device=device)
    starts = torch.empty((2, k_p2), dtype=torch.int32, device=device)
    counts = torch.empty((2, k_p2), dtype=torch.int32, device=device)
    _local_order_probe[(2,)](idx, order, starts, counts, 9, 4, chunk, CMAX=cmax, K_P2=k_p2)
    for p, lo in enumerate((0, 5)):
        rows = range(lo, min(lo + chunk, 9))
        key = lambda r: (idx[r].item() if 0 <= idx[r] < 4 else 4, r)  # bad indices: segment M = 4
        expected = [r - lo for r in sorted(rows, key=key)]
        assert order[p * cmax:p * cmax + len(expected)].tolist() == expected
        segs = [key(r)[0] for r in rows]
        want_counts = [segs.count(k) for k in range(5)]
        assert counts[p, :5].tolist() == want_counts
        assert starts[p, :5].tolist() == [sum(want_counts[:k]) for k in range(5)]


def test_many_backward_programs_agree_with_float64(device, monkeypatch):
    """Small chunks: programs that hold no row of some table row, or only bad-index rows, still
    write their (zero) partials, and the cross-program sum stays fp32-accurate."""
    import dataclasses

    from kernels import norm_modulate as K
    params, inputs, grad_out = case(device, 24, 40)
    small_chunks = dataclasses.replace(K.launch_config(24), chunk_limit=3)
    assert K.backward_split(40, small_chunks, device)[0] >= 14
    monkeypatch.setattr(K, "launch_config", lambda hidden: small_chunks)
    y, grads = run(inputs, grad_out)
    ref = reference(params, inputs, grad_out)
    for name in NAMES:
        assert rel_err(grads[name], ref.grads[name]) <= TOL["bfloat16"] * 1.2, name
    _, again = run(inputs, grad_out)
    for name in ("w", "sh", "sc"):
        assert torch.equal(as_bits(grads[name]), as_bits(again[name])), name



def test_fast_launch_matches_triton_launch(device, monkeypatch):
    """kernels/common.py's launch skips triton's per-call Python; outputs and gradients must not change a bit."""
    if device.type != "cuda":
        pytest.skip("on the CPU the interpreter always takes triton's own launch: compared on a GPU only")
    from kernels import common as launch
    params, inputs, grad_out = case(device, 5376, 300)
    results = []
    for enabled in (False, True, True):  # the second fast call takes the cached compiled kernel
        monkeypatch.setattr(launch, "ENABLED", enabled)
        results.append(run(inputs, grad_out))
    for y, grads in results[1:]:
        assert torch.equal(as_bits(y), as_bits(results[0][0]))
        for name in NAMES:
            assert torch.equal(as_bits(grads[name]), as_bits(results[0][1][name])), name

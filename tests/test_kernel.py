"""Our Triton norm_modulate against float64, its invariance, and its argument errors."""
import pytest
import torch
import triton
import triton.language as tl

from h3bench.harness.execute import as_bits
from h3bench.harness.ops.norm_modulate import OP
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels.norm_modulate_api import norm_modulate
from h3bench.kernels.common import local_order
from tests.helpers import STRIDED, assert_same_bits, nm_params, row_gapped, shifted

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


def run(inputs, grad_out, idx=None, x=None, check_index=True):
    t = inputs.tensors
    leaves = [(x if (n == "x" and x is not None) else t[n]).detach().requires_grad_() for n in NAMES]
    y = norm_modulate(*leaves, t["idx"] if idx is None else idx, check_index=check_index)
    y.backward(grad_out.reshape(y.shape))
    return y.detach(), {n: l.grad for n, l in zip(NAMES, leaves)}


def assert_bf16_matches_float64(params, inputs, grad_out, y, grads):
    """A bf16 case's output and gradients against the float64 reference, within the bf16 bounds."""
    ref = reference(params, inputs, grad_out)
    assert rel_err(y, ref.outputs[0]) <= TOL["bfloat16"]
    for name in NAMES:
        assert rel_err(grads[name], ref.grads[name]) <= TOL["bfloat16"] * 1.2, name


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


@pytest.mark.parametrize("layout", [*STRIDED, "halves"])
@pytest.mark.parametrize("table_rows", [9, 40])  # local plan, global plan (M > local_max)
def test_strided_inputs_give_the_contiguous_bits(device, layout, table_rows):
    """Every argument and the upstream gradient a strided view (NaN or an out-of-range index between the
    elements; "halves": sh and sc the two column halves of one row-strided [M, 2H] table, as the harness
    passes them): output, gradients and the no-grad output bitwise those of contiguous inputs."""
    _, inputs, grad_out = _table_case(device, 7, 13, table_rows)
    dense = {n: inputs.tensors[n].contiguous() for n in (*NAMES, "idx")}
    y, grads = run(OP.bundle(dense), grad_out)
    view = row_gapped if layout == "halves" else STRIDED[layout]
    strided = {n: view(t) for n, t in dense.items()}
    if layout == "halves":
        table = row_gapped(torch.cat([dense["sh"], dense["sc"]], dim=1))
        strided["sh"], strided["sc"] = table.chunk(2, dim=1)
    assert strided["idx"].stride(0) == 2 and all(torch.equal(strided[n], dense[n]) for n in dense)
    s_y, s_grads = run(OP.bundle(strided), view(grad_out))
    assert torch.equal(as_bits(s_y), as_bits(y))
    for name in NAMES:
        assert torch.equal(as_bits(s_grads[name]), as_bits(grads[name])), name
    with torch.no_grad():
        assert torch.equal(as_bits(norm_modulate(*(strided[n] for n in (*NAMES, "idx")))), as_bits(y))


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
    (lambda t: {"w": t["w"].double()}, TypeError, "w has dtype"),
    (lambda t: {"sc": t["sc"].to(torch.int32)}, TypeError, "sc has dtype"),
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


@pytest.mark.parametrize("eps,error,match", [
    (float("nan"), ValueError, "eps must be finite and >= 0"),
    (float("inf"), ValueError, "eps must be finite and >= 0"),
    (-1e-5, ValueError, "eps must be finite and >= 0"),
    (True, TypeError, "eps must be a real number"),
    ("1e-5", TypeError, "eps must be a real number"),
    (None, TypeError, "eps must be a real number"),
])
def test_bad_eps_is_refused(device, eps, error, match):
    """An eps that makes rows NaN (NaN, infinite, negative) or is not a number is an error, in training and
    in inference, not NaN outputs."""
    _, inputs, _ = case(device, 8, 5)
    args = [inputs.tensors[n] for n in ("x", "w", "sh", "sc", "idx")]
    with pytest.raises(error, match=match):
        norm_modulate(*args, eps=eps)
    with pytest.raises(error, match=match), torch.no_grad():
        norm_modulate(*args, eps=eps)


def test_eps_zero_and_numpy_scalars_are_taken(device):
    """eps = 0 is allowed (torch's rms_norm allows it); an int or numpy scalar gives the float's bits."""
    import numpy as np
    _, inputs, _ = case(device, 8, 5)
    args = [inputs.tensors[n] for n in ("x", "w", "sh", "sc", "idx")]
    assert torch.isfinite(norm_modulate(*args, eps=0.0)).all()  # the case's rows are not all zero
    want = norm_modulate(*args, eps=1e-5)
    assert torch.equal(norm_modulate(*args, eps=np.float32(1e-5)), norm_modulate(*args, eps=float(np.float32(1e-5))))
    assert torch.equal(norm_modulate(*args, eps=np.float64(1e-5)), want)
    assert torch.equal(norm_modulate(*args, eps=0), norm_modulate(*args, eps=0.0))


BAD_INPUTS = [
    (lambda t: {"w": t["w"][:-1]}, ValueError, "w must have shape"),
    (lambda t: {"sh": t["sh"][:, :-1]}, ValueError, "sh must have shape"),
    (lambda t: {"sc": t["sc"][None]}, ValueError, "sc must have shape"),
    (lambda t: {"sc": t["sc"][:-1]}, ValueError, "same number of table rows"),
    (lambda t: {"idx": t["idx"][:-1]}, ValueError, "idx must have shape"),
    (lambda t: {"x": t["x"][:-1]}, ValueError, "idx must have shape"),
    (lambda t: {"w": t["w"].double()}, TypeError, "w has dtype"),
    (lambda t: {"sh": t["sh"].double()}, TypeError, "sh has dtype"),
    (lambda t: {"sc": t["sc"].to(torch.int32)}, TypeError, "sc has dtype"),
    (lambda t: {"x": t["x"].to(torch.int32)}, TypeError, "x has dtype"),
    (lambda t: {"idx": t["idx"].float()}, TypeError, "idx has dtype"),
    (lambda t: {"idx": t["idx"].to(torch.int16)}, TypeError, "idx has dtype"),
    (lambda t: {"sc": t["sc"].to("meta")}, ValueError, "sc is on meta"),
    (lambda t: {"idx": t["idx"].to("meta")}, ValueError, "idx is on meta"),
    (lambda t: {"sh": t["sh"].tolist()}, TypeError, "sh must be a torch.Tensor"),
    (lambda t: {"x": t["x"][:, :0], "w": t["w"][:0]}, ValueError, "H >= 1"),
    (lambda t: {"x": t["x"].new_zeros(1, 32769), "w": t["w"].new_zeros(32769), "idx": t["idx"][:1]}, ValueError,
     "H <= 32768"),
]


@pytest.mark.parametrize("change,error,match", BAD_INPUTS)
def test_a_call_unlike_a_good_one_leaves_the_fast_path_and_raises(device, change, error, match):
    """The one-predicate check (`_fast_ok`: CUDA, or the CPU under the interpreter) accepts a well-formed
    call, and a call that differs from it in any checked property (shape, dtype, device, type, H bounds)
    fails it and raises the detailed check's error, also right after a good call."""
    from h3bench.kernels import norm_modulate_api as api
    _, inputs, _ = case(device, 8, 5)
    good = {**inputs.tensors}
    names = ("x", "w", "sh", "sc", "idx")
    assert api._fast_ok(*(good[n] for n in names))
    norm_modulate(*(good[n] for n in names))
    bad = {**good, **change(good)}
    assert not api._fast_ok(*(bad[n] for n in names))
    with pytest.raises(error, match=match):
        norm_modulate(*(bad[n] for n in names))


def test_fast_predicate_only_where_the_detailed_check_passes(device, monkeypatch):
    """`_fast_ok` True implies `_check` passes (mixed dtypes, int32 indices, row-strided tables); on the CPU it
    holds only under the interpreter, as `_check`'s device rule."""
    from h3bench.kernels import common
    from h3bench.kernels import norm_modulate_api as api
    _, inputs, _ = case(device, 8, 5)
    t = inputs.tensors
    table = torch.randn(9, 16, device=device)
    variants = [dict(t), dict(t, idx=t["idx"].int()), dict(t, x=t["x"].float(), sh=t["sh"].half()),
                dict(t, sh=table[:, :8], sc=table[:, 8:]), dict(t, x=t["x"].reshape(5, 1, 8)),
                dict(t, x=t["x"].reshape(5, 1, 8), idx=t["idx"].reshape(5, 1))]
    names = ("x", "w", "sh", "sc", "idx")
    for args in variants:
        assert api._fast_ok(*(args[n] for n in names)) == (args["idx"].dim() == 1)
        api._check(*(args[n] for n in names))  # passes: the fast predicate accepted nothing it refuses
    if device.type == "cpu":
        monkeypatch.setattr(common, "INTERPRETED", False)
        assert not api._fast_ok(*(t[n] for n in names))
        with pytest.raises(ValueError, match="x is on cpu"):
            norm_modulate(*(t[n] for n in names))


@pytest.mark.parametrize("hidden,rows", [(2048, 9), (3000, 20), (5376, 6)])
def test_wide_rows_path(device, hidden, rows):
    """Wide H: whole rows in registers, one or two rows per backward step (prefetched; two programs an
    SM up to 4096 lanes a row); the per-row forward (head + tail blocks; x read again above 4096)."""
    from h3bench.kernels.norm_modulate_kernel import launch_config
    assert launch_config(hidden).bwd_rows <= 2 and not launch_config(hidden).bwd_cols
    params, inputs, grad_out = case(device, hidden, rows)
    y, grads = run(inputs, grad_out)
    assert_bf16_matches_float64(params, inputs, grad_out, y, grads)
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

    from h3bench.kernels import norm_modulate_kernel as K
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



@pytest.mark.parametrize("hidden", [5376, 12288])   # whole rows and the split backward
def test_fast_launch_matches_triton_launch(device, monkeypatch, hidden):
    """kernels/common.py's keyed launches skip triton's per-call Python (the binder too, after the first
    call per key); outputs and gradients must not change a bit against triton's own launch or the binder's."""
    if device.type != "cuda":
        pytest.skip("on the CPU the interpreter always takes triton's own launch: compared on a GPU only")
    from h3bench.kernels import common as launch
    params, inputs, grad_out = case(device, hidden, 300)
    results = []
    # triton's own path; the binder on every call; keyed (the first call remembers, the second reuses)
    for enabled, keyed in ((False, True), (True, False), (True, True), (True, True)):
        monkeypatch.setattr(launch, "ENABLED", enabled)
        monkeypatch.setattr(launch, "KEYED", keyed)
        results.append(run(inputs, grad_out))
    for y, grads in results[1:]:
        assert torch.equal(as_bits(y), as_bits(results[0][0]))
        for name in NAMES:
            assert torch.equal(as_bits(grads[name]), as_bits(results[0][1][name])), name


@pytest.mark.parametrize("table_rows", [9, 40])   # the local plan, and the global one (sorted idx, combine)
def test_a_launch_key_tells_aligned_from_unaligned_tensors(device, table_rows):
    """The launches reuse a compiled kernel by the caller's key (`kernels.common.launch_keyed`, the tensors'
    part from `kernels.common.tensor_key`): x, w, sh, sc and idx one element off 16-byte alignment, with
    the shapes and strides of aligned ones, must not take the aligned launches' kernels (their vector loads would fault or read
    wrong data). Each layout twice (the second call through the key); same values, same order: the
    outputs and gradients bitwise equal, and within bf16's bounds of float64."""
    from h3bench.kernels import norm_modulate_kernel as K
    params, aligned, grad_out = _table_case(device, 64, 40, table_rows)
    assert (table_rows > K.launch_config(64).local_max) == (table_rows == 40)
    t = aligned.tensors
    moved = OP.bundle({name: shifted(v) for name, v in t.items()})
    assert moved.tensors["x"].data_ptr() % 16 and moved.tensors["sh"].stride() == t["sh"].stride()
    results = [run(bundle, grad_out) for bundle in (aligned, aligned, moved, moved)]
    assert_bf16_matches_float64(params, moved, grad_out, *results[-1])
    for y, grads in results[1:]:
        assert torch.equal(as_bits(y), as_bits(results[0][0]))
        for name in NAMES:
            assert torch.equal(as_bits(grads[name]), as_bits(results[0][1][name])), name


# --- every dtype users bring -----------------------------------------------------------------------------

def _retyped(inputs, dtypes):
    """The case with w, sh, sc cast to `dtypes` (x keeps its own); sh and sc stay strided views."""
    from h3bench.harness.ops.norm_modulate import TABLE_CHUNKS
    t = dict(inputs.tensors)
    t["w"] = t["w"].to(dtypes[0])
    for name, dtype in zip(("sh", "sc"), dtypes[1:]):
        table = torch.zeros(t[name].shape[0], TABLE_CHUNKS * t[name].shape[1], dtype=dtype, device=t[name].device)
        table[:, :t[name].shape[1]] = t[name].to(dtype)
        t[name] = table[:, :t[name].shape[1]]
    return OP.bundle(t)


@pytest.mark.parametrize("x_dtype,param_dtypes", [
    ("bfloat16", (torch.bfloat16, torch.float32, torch.float32)),   # bf16 activations, fp32 tables (Liger's case)
    ("float16", (torch.bfloat16, torch.float16, torch.float16)),    # fp16 x with a bf16 w
    ("float32", (torch.float32, torch.float32, torch.float32)),
    ("bfloat16", (torch.float32, torch.bfloat16, torch.float16)),   # sh and sc of different dtypes
    ("float32", (torch.bfloat16, torch.float16, torch.bfloat16)),
])
def test_mixed_dtypes_match_float64(device, x_dtype, param_dtypes):
    """fp32 math, one rounding per output: y and dx in x's dtype, dw in w's, dsh in sh's, dsc in sc's."""
    params, inputs, grad_out = case(device, 24, 30, x_dtype)
    inputs = _retyped(inputs, param_dtypes)
    y, grads = run(inputs, grad_out)
    ref = reference(params, inputs, grad_out)
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
    assert y.dtype == params.torch_dtype and rel_err(y, ref.outputs[0]) <= TOL[x_dtype]
    for name in NAMES:
        dtype = inputs.tensors[name].dtype
        assert grads[name].dtype == dtype, name
        assert rel_err(grads[name], ref.grads[name]) <= TOL[names[dtype]] * 1.2, name


def test_mixed_dtypes_invariant_and_repeatable(device):
    params, inputs, grad_out = case(device, 40, 33, "bfloat16")
    inputs = _retyped(inputs, (torch.float32, torch.float32, torch.float16))
    y, grads = run(inputs, grad_out)
    _, again = run(inputs, grad_out)
    for name in ("w", "sh", "sc"):
        assert torch.equal(as_bits(grads[name]), as_bits(again[name])), name
    for r in (0, 32):
        y1, g1 = run(inputs.select_rows(torch.tensor([r], device=device)), grad_out[r:r + 1])
        assert torch.equal(as_bits(y1[0]), as_bits(y[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


# --- many table rows: the global plan, bounded partial memory -------------------------------------------

def _config(monkeypatch, hidden, **changes):
    """Use launch_config(hidden) with `changes` (small chunks give many backward programs on the CPU)."""
    import dataclasses

    from h3bench.kernels import norm_modulate_kernel as K
    cfg = dataclasses.replace(K.launch_config(hidden), **changes)
    monkeypatch.setattr(K, "launch_config", lambda h: cfg)
    return cfg


def _table_case(device, hidden, rows, table_rows, seed=5, dtype="bfloat16"):
    """(params, inputs, grad_out) of R rows, M table rows. float32 where a test compares c's order bitwise:
    a bf16 dx hides most one-ulp changes of c."""
    params = nm_params(hidden, dtype, timesteps=table_rows, modalities=1)
    inputs = OP.make_inputs(params, rows, seed, device)
    return params, inputs, OP.make_grad_outs(params, rows, seed + 100, device)[0]


def _with_idx(inputs, idx):
    return OP.bundle({**inputs.tensors, "idx": idx})


# Three kernel sets at H = 20: the per-row forward (under the global plan too) + the whole-row backward; the
# plan walk forward (M > local_max) + the whole-row backward; the per-row forward + the split backward (c
# first in three chunks of 8, the last one short, each loaded a chunk ahead; then column blocks of 8: 3
# blocks at H = 20, 2 at 16).
KERNEL_SETS = {"rows+rows": dict(fwd_rows=4, plan_walk_rows=0, bwd_rows=2, bwd_cols=0),
               "walk+rows": dict(fwd_rows=2, plan_walk_rows=2, plan_walk_warps=2, bwd_rows=2, bwd_cols=0),
               "rows+split": dict(fwd_rows=2, plan_walk_rows=0, bwd_rows=2, bwd_cols=8, dots_rows=2, dots_chunk=8)}


@pytest.mark.parametrize("kernels", KERNEL_SETS)
@pytest.mark.parametrize("table_rows", [9, 40])   # the local plan and the global one
def test_x_gradient_alone_is_the_full_backward_dx(device, monkeypatch, kernels, table_rows):
    """Only x requiring a gradient: the backward skips the parameter sums (PARAMS off: no partials, no
    parameter stage), and its dx is bitwise the dx of the backward that makes every gradient. The
    interpreter contracts nothing, so on the CPU this holds whatever the launch options; the compiled
    kernels' side is test_backward_compiles_without_contraction."""
    _config(monkeypatch, 20, chunk_limit=4, local_max=16, **KERNEL_SETS[kernels])
    params, inputs, grad_out = _table_case(device, 20, 26, table_rows, dtype="float32")
    _, full = run(inputs, grad_out)
    t = inputs.tensors
    x = t["x"].detach().requires_grad_()
    y = norm_modulate(x, t["w"], t["sh"], t["sc"], t["idx"])
    y.backward(grad_out.reshape(y.shape))
    assert torch.equal(as_bits(x.grad), as_bits(full["x"]))


# Compiles `_bwd_kernel` for sm_90 (no GPU needed) with each launch's constexprs and options, in a process of
# its own: under TRITON_INTERPRET (the CPU suite) this process's kernels cannot be compiled.
_PTX_OF = """
import json, sys
from h3bench.kernels import norm_modulate_kernel as K
from tools.compile_norm_modulate import compile_for
metas = json.loads(sys.stdin.read())
print(json.dumps([compile_for(K._bwd_kernel, {k: v for k, v in m.items() if k != "num_warps"},
                              m["num_warps"]).asm["ptx"] for m in metas]))
"""


def _backward_ptx(metas: list[dict]) -> list[str]:
    import json
    import os
    import subprocess
    import sys

    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip("triton has no NVIDIA backend here: nothing compiles for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _PTX_OF], input=json.dumps(metas), capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_backward_compiles_without_contraction(monkeypatch):
    """PARAMS (a constexpr) compiles `_bwd_kernel` twice. With FMA contraction on, LLVM fused a different
    product of dx = (dy * a - xhat * c) * rstd in each (kernels/notes/norm_modulate.md), so dx moved by 1-2
    ULP when the parameters need no gradient. The launches turn contraction off: compiled for sm_90 with
    each launch's constexprs and options (split and whole-row backward, local and global plan, with and
    without parameter gradients), no compilation has an FMA, so every operation of dx is rounded as written
    in both. The same kernel with contraction on does have them (the check sees one when it is there)."""
    import dataclasses

    from h3bench.kernels import norm_modulate_kernel as K
    metas = []
    for kernels in ("rows+split", "rows+rows"):
        cfg = _config(monkeypatch, 20, chunk_limit=4, local_max=16, **KERNEL_SETS[kernels])
        for table_rows in (9, 40):
            for need_params in (True, False):
                meta = K._bwd_recipe(26, 20, table_rows, need_params, cfg, -1)[7]
                assert meta["enable_fp_fusion"] is False
                metas.append(dict(meta, BY_HAND=False))
    # the measuring preset (tools/sweep_norm_modulate.py's bwd-fp-fusion) turns it back on through the config
    on = K._bwd_recipe(26, 20, 9, True, dataclasses.replace(cfg, bwd_fp_fusion=True), -1)[7]
    assert on["enable_fp_fusion"] is True
    *compiled, fused = _backward_ptx(metas + [dict(on, BY_HAND=False)])
    for meta, ptx in zip(metas, compiled):
        assert "fma.rn.f32" not in ptx and "mul.rn.f32" in ptx, meta
    assert "fma.rn.f32" in fused


@pytest.mark.parametrize("kernels", KERNEL_SETS)
@pytest.mark.parametrize("table_rows,layout", [(300, "random"), (40, "one row"), (1, "random"), (40, "sorted")])
def test_table_sizes_match_float64(device, monkeypatch, kernels, table_rows, layout):
    """M from 1 to M > R; all rows on one table row (its segment spans every backward program); rows
    sorted by table row (segments cut exactly at program ends). Unused table rows get exact zeros, and
    the parameter gradients repeat bitwise."""
    from h3bench.kernels import norm_modulate_kernel as K
    cfg = _config(monkeypatch, 20, chunk_limit=4, local_max=16, **KERNEL_SETS[kernels])
    params, inputs, grad_out = _table_case(device, 20, 26, table_rows)
    if layout == "one row":
        inputs = _with_idx(inputs, torch.full((26,), 7, dtype=torch.long, device=device))
    elif layout == "sorted":
        inputs = _with_idx(inputs, torch.arange(26, device=device) // 4 * 3)
    assert K.backward_split(26, cfg, device)[0] >= 7  # 7 on the CPU (one program per 4 rows), 26 on a GPU
    _matches_float64_zero_unused_repeats(params, inputs, grad_out, table_rows)


def _matches_float64_zero_unused_repeats(params, inputs, grad_out, table_rows):
    """y and the gradients against float64, exact zeros for table rows no index names, parameter
    gradients bitwise equal on a second run; returns (y, grads)."""
    y, grads = run(inputs, grad_out)
    assert_bf16_matches_float64(params, inputs, grad_out, y, grads)
    unused = torch.ones(table_rows, dtype=torch.bool, device=y.device)
    unused[inputs.tensors["idx"]] = False
    assert torch.count_nonzero(grads["sh"][unused]) == 0 and torch.count_nonzero(grads["sc"][unused]) == 0
    _, again = run(inputs, grad_out)
    for name in ("w", "sh", "sc"):
        assert torch.equal(as_bits(grads[name]), as_bits(again[name])), name
    return y, grads


@pytest.mark.parametrize("kernels", KERNEL_SETS)
@pytest.mark.parametrize("table_rows", [9, 40])
def test_bad_indices_give_nan_rows_and_no_contribution(device, monkeypatch, kernels, table_rows):
    """check_index=False: rows with idx < 0 or >= M come out NaN (y and dx); the other rows and every
    parameter gradient are those of the good rows alone. Local plan (M = 9) and global (M = 40)."""
    _config(monkeypatch, 16, chunk_limit=5, local_max=16, **KERNEL_SETS[kernels])
    params, inputs, grad_out = _table_case(device, 16, 24, table_rows)
    idx = inputs.tensors["idx"].clone()
    bad = torch.tensor([2, 3, 11, 23], device=device)
    idx[bad] = torch.tensor([-1, table_rows, 1000, -7], device=device)
    leaves = [inputs.tensors[n].detach().requires_grad_() for n in NAMES]
    y = norm_modulate(*leaves, idx, check_index=False)
    y.backward(grad_out)
    good = torch.tensor([r for r in range(24) if r not in bad.tolist()], device=device)
    sub = inputs.select_rows(good)
    ref = reference(params, sub, grad_out[good])
    assert torch.isnan(y[bad]).all() and torch.isnan(leaves[0].grad[bad]).all()
    assert rel_err(y[good], ref.outputs[0]) <= TOL["bfloat16"]
    assert rel_err(leaves[0].grad[good], ref.grads["x"]) <= TOL["bfloat16"] * 1.2
    for leaf, name in zip(leaves[1:], NAMES[1:]):
        assert rel_err(leaf.grad, ref.grads[name]) <= TOL["bfloat16"] * 1.2, name


def test_local_plan_for_more_table_rows(device, monkeypatch):
    """local_max raised above M (the sweep's local-max-64 preset): the local plan at M = 40 matches
    float64, gives unused table rows exact zeros, repeats bitwise, and keeps a row alone equal to it in
    the batch."""
    from h3bench.kernels import norm_modulate_kernel as K
    cfg = _config(monkeypatch, 20, chunk_limit=4, local_max=64)
    assert not K.wants_plan(40, True, cfg)
    params, inputs, grad_out = _table_case(device, 20, 26, 40)
    y, grads = _matches_float64_zero_unused_repeats(params, inputs, grad_out, 40)
    y1, g1 = run(inputs.select_rows(torch.tensor([9], device=device)), grad_out[9:10])
    assert torch.equal(as_bits(y1[0]), as_bits(y[9])) and torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][9]))


def test_many_table_rows_row_alone_equals_row_in_batch(device, monkeypatch):
    _config(monkeypatch, 24, chunk_limit=6)
    params, inputs, grad_out = _table_case(device, 24, 30, 120)
    y, grads = run(inputs, grad_out)
    for r in (0, 17, 29):
        y1, g1 = run(inputs.select_rows(torch.tensor([r], device=device)), grad_out[r:r + 1])
        assert torch.equal(as_bits(y1[0]), as_bits(y[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


def test_partial_memory_is_bounded():
    """Partial sums: [programs, 2M + 1, H] fp32 up to local_max, then [programs, 5, H] whatever M is."""
    from h3bench.kernels import norm_modulate_kernel as K
    assert K.partial_rows(9, global_plan=False) == 19
    for table_rows in (17, 1024, 4096, 10 ** 6):
        assert K.partial_rows(table_rows, global_plan=True) == 5


# --- wide H: the split backward ---------------------------------------------------------------------------

@pytest.mark.parametrize("hidden,rows", [(12288, 3), (32768, 2)])
def test_wide_rows_default_backward(device, hidden, rows):
    """Above SPLIT_ABOVE the default is the split backward: within bf16's bounds of float64, the last row
    alone bitwise as in the batch."""
    from h3bench.kernels.norm_modulate_kernel import launch_config
    assert launch_config(hidden).bwd_cols == 4096
    _wide_rows_match_float64_and_row_alone(device, hidden, rows)


def _wide_rows_match_float64_and_row_alone(device, hidden, rows):
    params, inputs, grad_out = case(device, hidden, rows)
    y, grads = run(inputs, grad_out)
    assert_bf16_matches_float64(params, inputs, grad_out, y, grads)
    y1, g1 = run(inputs.select_rows(torch.tensor([rows - 1], device=device)), grad_out[rows - 1:])
    assert torch.equal(as_bits(y1[0]), as_bits(y[rows - 1]))
    assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][rows - 1]))


def test_split_backward_wide_rows(device, monkeypatch):
    """The split backward at H = 12288 in blocks of 2048 (the default's are 4096): c over six chunks of
    DOTS_CHUNK, then six column blocks of four rows a step."""
    from h3bench.kernels import norm_modulate_kernel as K
    cfg = _config(monkeypatch, 12288, bwd_cols=2048, bwd_rows=4)
    assert K.cdiv(12288, K.DOTS_CHUNK) > 1 and K.cdiv(12288, cfg.bwd_cols) == 6
    _wide_rows_match_float64_and_row_alone(device, 12288, 3)


@pytest.mark.parametrize("changes", [dict(fwd_rows=4, fwd_l1_tables=True),
                                     dict(fwd_rows=2, fwd_reload=True),
                                     dict(bwd_cols=16, bwd_rows=4),   # the split backward, 3 column blocks
                                     # its first pass 4 rows a program in 16-column chunks
                                     dict(bwd_cols=16, bwd_rows=4, dots_rows=4, dots_chunk=16)],
                         ids=["rows-l1", "rows-reload", "split", "split-dots-r4c16"])
def test_launch_shapes_are_batch_invariant(device, monkeypatch, changes):
    """The defaults' kernels at other shapes keep a row's bits independent of the batch around it."""
    _config(monkeypatch, 40, chunk_limit=8, **changes)
    params, inputs, grad_out = case(device, 40, 37)
    y, grads = run(inputs, grad_out)
    ref = reference(params, inputs, grad_out)
    assert rel_err(y, ref.outputs[0]) <= TOL["bfloat16"]
    for r in (0, 36):
        y1, g1 = run(inputs.select_rows(torch.tensor([r], device=device)), grad_out[r:r + 1])
        assert torch.equal(as_bits(y1[0]), as_bits(y[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


@pytest.mark.parametrize("hidden", [24, 40])
def test_forward_reload_keeps_the_bits(device, monkeypatch, hidden):
    """fwd_reload (x read again for y, the default above 4096 lanes a row) moves loads, not arithmetic: y
    and every gradient are the bits of x held in registers, in row order under both plans (M = 9 and 40,
    plan_walk_rows 0), bad indices too; H = 40 has a tail block (32 + 8)."""
    for table_rows in (9, 40):
        params, inputs, grad_out = _table_case(device, hidden, 30, table_rows)
        base = dict(chunk_limit=6, local_max=16, fwd_rows=2, plan_walk_rows=0)
        bad = inputs.tensors["idx"].clone()
        bad[[3, 17]] = torch.tensor([-1, table_rows + 2], device=bad.device)  # NaN rows, no gradient share
        for idx in (None, bad):
            outs = []
            for reload in (False, True):
                _config(monkeypatch, hidden, **base, fwd_reload=reload)
                outs.append(run(inputs, grad_out, idx=idx, check_index=idx is None))
            assert_same_bits(*outs)
            y1, g1 = outs[1]
            if idx is None:
                assert_bf16_matches_float64(params, inputs, grad_out, y1, g1)
            else:
                assert y1[[3, 17]].isnan().all() and not y1[[0, 16]].isnan().any()


@pytest.mark.parametrize("hidden", [24, 40])
def test_plan_walk_forward(device, monkeypatch, hidden):
    """M > local_max: the forward walks the plan (plan_walk_rows) in training and inference alike, so both
    give the same y bits; bad indices give NaN rows; the result is within bf16 of float64."""
    from h3bench.kernels import norm_modulate_kernel as K
    from h3bench.kernels.norm_modulate_api import norm_modulate
    cfg = _config(monkeypatch, hidden, chunk_limit=6, local_max=16, fwd_rows=2, plan_walk_rows=2, plan_walk_warps=2)
    params, inputs, grad_out = _table_case(device, hidden, 30, 40)
    assert K._fwd_recipe(30, hidden, 40, True, True, cfg, -1)[0] is K._fwd_walk_kernel
    assert K._fwd_recipe(30, hidden, 9, False, True, cfg, -1)[0] is K._fwd_rows_kernel
    assert K.wants_plan(40, False, cfg) and not K.wants_plan(9, False, cfg)
    y, grads = run(inputs, grad_out)
    assert_bf16_matches_float64(params, inputs, grad_out, y, grads)
    t = inputs.tensors
    with torch.no_grad():
        y_inference = norm_modulate(t["x"], t["w"], t["sh"], t["sc"], t["idx"])
    assert torch.equal(as_bits(y_inference), as_bits(y))
    bad = t["idx"].clone()
    bad[[2, 29]] = torch.tensor([-5, 40], device=bad.device)
    with torch.no_grad():
        y_bad = norm_modulate(t["x"], t["w"], t["sh"], t["sc"], bad, check_index=False)
    assert y_bad[[2, 29]].isnan().all() and not y_bad[[0, 1, 28]].isnan().any()
    assert torch.equal(as_bits(y_bad[:2]), as_bits(y[:2]))


# --- tools/sweep_norm_modulate.py: importable and checked on the CPU ---------------------------------

def test_sweep_tool_arguments_floors_and_refusal(monkeypatch):
    from tools import sweep_norm_modulate as sweep
    args = sweep.parse_args([])
    assert (args.hidden, args.table_rows, args.rows) == (list(sweep.HIDDENS), list(sweep.TABLE_ROWS), 32768)
    assert (args.warmup, args.reps) == (20, 100) and "gather" in args.variants
    assert sweep.parse_args(["--variants", ""]).variants == []
    with pytest.raises(SystemExit):
        sweep.parse_args(["--variants", "no-such-preset"])
    # floors: 4RH and 10RH bytes over the bandwidth (kernels/notes/norm_modulate.md: 165.8 and 414.5 us at
    # 4250 GB/s)
    assert sweep.floor_us(5376, 32768, False, 4250) == pytest.approx(165.8, abs=0.1)
    assert sweep.floor_us(5376, 32768, True, 4250) == pytest.approx(414.5, abs=0.1)
    from h3bench.kernels.norm_modulate_kernel import launch_config
    grid = sweep.variant_grid(list(sweep._variant_names()), [1024, 8192], [9, 64])
    for name, hidden, table_rows, config in grid:
        assert config.block_h == triton.next_power_of_2(hidden) and table_rows in (9, 64)
        # a preset equal to the default is timed only when it is asked for as "default"
        assert name == "default" or config != launch_config(hidden)
    assert {(name, m) for name, _, m, _ in grid} >= {("default", 9), ("default", 64), ("fwd-plan-rows", 64)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        sweep.main(["--out", "unused.json"])


def test_sweep_tool_runs_end_to_end_on_the_interpreter(device, tmp_path):
    """Every step of the sweep at toy sizes (the --allow-cpu smoke mode): JSON, PNG and the table."""
    if device.type == "cuda":
        pytest.skip("the smoke mode is for the CPU; on a GPU run the tool itself")
    from tools import sweep_norm_modulate as sweep
    out = tmp_path / "sweep.json"
    report = sweep.main(["--allow-cpu", "--out", str(out), "--rows", "5", "--hidden", "16", "--table-rows", "20",
                         "--table-hidden", "16", "--variants", "gather", "--variant-hidden", "16", "--warmup", "0",
                         "--reps", "1", "--small-rows", "3", "--small-hidden", "16", "--dtype-rows", "3",
                         "--host-reps", "1"])
    saved = __import__("json").loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert [c["hidden"] for c in saved["hidden_sweep"]] == [16] and saved["table_rows_sweep"][0]["table_rows"] == 20
    for case in saved["hidden_sweep"] + saved["table_rows_sweep"]:
        assert set(case["rows"]) == {"ours", "torch_rms_norm", "composition"}
        assert {"sync_us", "stream_us", "floor_fraction_sync"} <= set(case["rows"]["ours"]["fwd_bwd_net"])
    assert saved["variants"][0]["variant"] == "gather"
    assert all(r["within_bounds"] and r["out_dtypes_ok"] for r in saved["dtype_matrix"])
    assert "host_us_per_call" in saved["small_batch"] and report["wall_s"] == saved["wall_s"]


def test_sweep_tool_variants_only(device, tmp_path):
    """The device script's `sweep-variants` step: no width or table-size sweep, no dtypes; the plot
    and the summary still come out (summary of a report without every section included)."""
    if device.type == "cuda":
        pytest.skip("the smoke mode is for the CPU; on a GPU run the tool itself")
    from tools import sweep_norm_modulate as sweep
    out = tmp_path / "variants.json"
    report = sweep.main(["--allow-cpu", "--out", str(out), "--rows", "5", "--hidden", "", "--table-rows", "",
                         "--no-dtypes", "--variants", "gather,default", "--variant-hidden", "16",
                         "--variant-table-rows", "9,20", "--warmup", "0",
                         "--reps", "1", "--small-rows", "3", "--small-hidden", "16", "--host-reps", "1"])
    assert report["hidden_sweep"] == [] and report["table_rows_sweep"] == []
    assert [(v["variant"], v["table_rows"]) for v in report["variants"]] == [
        ("gather", 9), ("default", 9), ("gather", 20), ("default", 20)]
    assert out.with_suffix(".png").stat().st_size > 0
    partial = dict(report)
    del partial["wall_s"]   # as a run cut short leaves it
    assert "cut short" in sweep.summary(partial)


def test_every_sweep_preset_is_a_valid_config_at_every_width():
    """tools/sweep_norm_modulate.py's variants (and kernel_times', which take the same names) build a
    LaunchConfig at every H the sweep covers: a preset that cannot apply to some H would stop a GPU call."""
    from tools.sweep_norm_modulate import _variant, _variant_names
    for hidden in (1024, 2048, 3072, 4096, 5376, 8192, 12288):
        for name in _variant_names():
            assert _variant(name, hidden).block_h == triton.next_power_of_2(hidden), (name, hidden)

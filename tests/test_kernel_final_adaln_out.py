"""Our final_adaln_out (kernels/final_adaln_out_kernel.py: torch projection + Triton norm_modulate) against
float64, its invariance, its parameter gradients' repeatability, and its argument errors."""
import dataclasses

import pytest
import torch

from h3bench.harness.config import load_config
from h3bench.harness.execute import as_bits
from h3bench.harness.ops.final_adaln_out import OP
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels import final_adaln_out_api as FA
from h3bench.kernels.final_adaln_out_api import final_adaln_out
from tests.helpers import STRIDED, assert_same_bits, run_quick_plan

NAMES = ("x", "nw", "temb", "w", "b")
PARAMS = ("nw", "temb", "w", "b")
EPS = 1e-5
# max|err|/max|ref| against the op's float64 reference, which rounds nothing: each value passes through at
# most three roundings to the parameters' dtype before it is compared (out: shift/scale, then out itself;
# dw: bf16(silu(temb)), dproj, then dw), each at most 2^-8 of the value in bf16, 2^-11 in fp16; in fp32
# only the arithmetic rounds. (The diffusers composition meets the same bound; measured: out 0.003-0.005,
# gradients <= 0.007 in bf16.)
ROUNDING = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}


def tol(dtype):
    return 3 * ROUNDING[dtype] if dtype in ROUNDING else 2e-5


def params(hidden=64, dim=32, dtype="bfloat16"):
    return dataclasses.replace(load_config("final_adaln_out", quick=True).inputs, hidden=hidden, temb_dim=dim,
                               dtype=dtype)


def case(device, hidden, rows, dtype="bfloat16", dim=32, seed=11):
    p = params(hidden, dim, dtype)
    t = dict(OP.make_inputs(p, rows, seed, device).tensors)
    return p, t, OP.make_grad_outs(p, rows, seed + 100, device)[0]


def run(t, dout, **kw):
    leaves = {n: (t[n].detach().requires_grad_() if n in NAMES else t[n]) for n in t}
    out = final_adaln_out(*leaves.values(), EPS, **kw)
    out.backward(dout.reshape(out.shape))
    return out.detach(), {n: leaves[n].grad for n in NAMES}


def reference(p, t, dout):
    return OP.reference(p, OP.bundle(t), (dout,), NAMES, OP.name)


@pytest.mark.parametrize("hidden,rows,dtype,index_dtype", [
    (64, 300, "bfloat16", torch.int64),
    (3, 300, "float16", torch.int32),
    (257, 7, "bfloat16", torch.int32),
    (2000, 1, "bfloat16", torch.int64),
    (40, 7, "float32", torch.int64),
])
def test_matches_float64(device, hidden, rows, dtype, index_dtype):
    p, t, dout = case(device, hidden, rows, dtype)
    t["ti"] = t["ti"].to(index_dtype)
    out, grads = run(t, dout)
    ref = reference(p, t, dout)
    assert out.shape == (rows, hidden) and out.dtype == p.torch_dtype
    assert rel_err(out, ref.outputs[0]) <= tol(p.torch_dtype)
    for name in NAMES:
        assert grads[name].shape == t[name].shape and grads[name].dtype == t[name].dtype, name
        assert rel_err(grads[name], ref.grads[name]) <= tol(p.torch_dtype), name


@pytest.mark.parametrize("x_dtype,nw_dtype,w_dtype", [
    (torch.bfloat16, torch.float32, torch.bfloat16), (torch.float32, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16, torch.float32), (torch.float16, torch.float32, torch.float32)])
def test_mixed_dtypes_match_float64(device, x_dtype, nw_dtype, w_dtype):
    """x, nw and the projection (w, b) each in its own dtype: out in x's, every gradient in its input's,
    within the widest rounding involved; a row alone gives the batch's bits."""
    p, t, dout = case(device, 48, 37)
    t = {**t, "x": t["x"].to(x_dtype), "nw": t["nw"].to(nw_dtype), "w": t["w"].to(w_dtype), "b": t["b"].to(w_dtype)}
    dout = dout.to(x_dtype)
    out, grads = run(t, dout)
    ref = reference(p, t, dout)
    bound = max(tol(d) for d in (x_dtype, nw_dtype, w_dtype))
    assert out.dtype == x_dtype and rel_err(out, ref.outputs[0]) <= bound
    for name in NAMES:
        assert grads[name].dtype == t[name].dtype, name
        assert rel_err(grads[name], ref.grads[name]) <= bound, name
    alone, alone_grads = run({**t, "x": t["x"][5:6], "ti": t["ti"][5:6]}, dout[5:6])
    assert torch.equal(as_bits(alone[0]), as_bits(out[5]))
    assert torch.equal(as_bits(alone_grads["x"][0]), as_bits(grads["x"][5]))


def test_hidden_one_and_zero_rows(device):
    # H = 1: the norm is sign(x) up to eps and dx a cancellation of near-equal terms (absolute bound).
    p, t, dout = case(device, 1, 9, "float32")
    out, grads = run(t, dout)
    ref = reference(p, t, dout)
    assert rel_err(out, ref.outputs[0]) <= 1e-6
    assert (grads["x"].double() - ref.grads["x"]).abs().max() <= 1e-4
    for name in PARAMS:
        assert rel_err(grads[name], ref.grads[name]) <= 1e-5, name
    p, t, dout = case(device, 8, 0)
    out, grads = run(t, dout)
    assert out.shape == (0, 8) and grads["x"].shape == (0, 8)
    for name in PARAMS:
        assert torch.count_nonzero(grads[name]) == 0, name


def test_strided_inputs_and_leading_dims(device):
    p, t, dout = case(device, 16, 12)
    flat_out, flat_grads = run(t, dout)
    wide_x = torch.cat([t["x"], t["x"]], dim=1)[:, 16:]  # row stride 2H
    wide_temb = torch.cat([t["temb"], t["temb"]], dim=1)[:, :32]
    wide_ti = t["ti"].repeat_interleave(2)[::2]  # stride 2
    assert wide_ti.stride(0) == 2
    strided = dict(t, x=wide_x, ti=wide_ti, temb=wide_temb)
    out, grads = run(strided, dout)
    assert torch.equal(as_bits(out), as_bits(flat_out)) and torch.equal(as_bits(grads["x"]), as_bits(flat_grads["x"]))
    strided = dict(t, x=wide_x.reshape(3, 4, 16), ti=t["ti"].reshape(3, 4), temb=wide_temb)
    out, grads = run(strided, dout)
    assert out.shape == (3, 4, 16) and torch.equal(as_bits(out.reshape(12, 16)), as_bits(flat_out))
    assert torch.equal(as_bits(grads["x"].reshape(12, 16)), as_bits(flat_grads["x"]))
    with torch.no_grad():
        plain = final_adaln_out(*t.values(), EPS)
    assert torch.equal(as_bits(plain), as_bits(flat_out))


def test_backward_takes_the_gemm_launches(device, monkeypatch):
    """The projection's backward runs as gemm.input_grad and gemm.weight_grad, once each a backward."""
    from h3bench.kernels import gemm
    calls = []
    for name in ("input_grad", "weight_grad"):
        real = getattr(gemm, name)
        monkeypatch.setattr(gemm, name, (lambda real, name: lambda *a, **k: calls.append(name) or real(*a, **k))(
            real, name))
    _, t, dout = case(device, 16, 20, "bfloat16")
    run(t, dout)
    assert sorted(calls) == ["input_grad", "weight_grad"]


@pytest.mark.parametrize("layout", STRIDED)
def test_strided_inputs_give_the_contiguous_bits(device, layout):
    """Every argument and the upstream gradient a strided view (NaN or an out-of-range index between the
    elements): output, gradients and the no-grad output bitwise those of contiguous inputs."""
    _, t, dout = case(device, 7, 13, dim=9)
    dense = {n: v.contiguous() for n, v in t.items()}
    out, grads = run(dense, dout)
    strided = {n: STRIDED[layout](v) for n, v in dense.items()}
    assert strided["ti"].stride(0) == 2 and strided["b"].stride(0) == 2
    assert all(torch.equal(strided[n], dense[n]) for n in dense)
    assert_same_bits(run(strided, STRIDED[layout](dout)), (out, grads))
    with torch.no_grad():
        assert torch.equal(as_bits(final_adaln_out(*strided.values(), EPS)), as_bits(out))


def run_some(t, dout, wants):
    """`run` with only the inputs named in `wants` requiring grad; (out, every input's .grad or None)."""
    leaves = {n: (t[n].detach().requires_grad_(n in wants) if n in NAMES else t[n]) for n in t}
    out = final_adaln_out(*leaves.values(), EPS)
    if wants:
        out.backward(dout.reshape(out.shape))
    else:
        assert out.grad_fn is None
    return out.detach(), {n: leaves[n].grad for n in NAMES}


@pytest.mark.parametrize("hidden,rows,dtype,timesteps", [
    (64, 300, "bfloat16", 3),
    (3, 40, "float16", 3),
    (40, 7, "float32", 3),
    (24, 50, "bfloat16", 20),  # M > local_max: norm_modulate's global plan (sorted rows, combine kernel)
])
def test_gradient_subsets_give_the_full_bits(device, hidden, rows, dtype, timesteps):
    """Any subset of inputs wanting a gradient (and none, without grad mode too): the output and each
    parameter gradient asked for bitwise those of the run with every gradient, the others None; dx so
    wherever a parameter gradient is asked for too (x's alone is norm_modulate's split backward without
    PARAMS: within the float64 bound), in leading dims as well."""
    p, t, dout = case(device, hidden, rows, dtype)
    if timesteps != t["temb"].shape[0]:
        gen = torch.Generator(device=device).manual_seed(5)
        t["temb"] = torch.randn(timesteps, t["temb"].shape[1], generator=gen, device=device)
        t["ti"] = torch.randint(0, timesteps, (rows,), generator=gen, device=device)
    full_out, full = run_some(t, dout, NAMES)
    for wants in (("x",), ("nw",), ("temb",), ("w", "b"), ("w",), ("x", "b"), ()):
        out, grads = run_some(t, dout, wants)
        assert torch.equal(as_bits(out), as_bits(full_out)), wants
        for name in NAMES:
            if name not in wants:
                assert grads[name] is None, (wants, name)
            elif name != "x" or len(wants) > 1:
                assert torch.equal(as_bits(grads[name]), as_bits(full[name])), (wants, name)
            else:
                ref = reference(p, t, dout)
                assert rel_err(grads["x"], ref.grads["x"]) <= tol(p.torch_dtype)
    with torch.no_grad():
        assert torch.equal(as_bits(final_adaln_out(*t.values(), EPS)), as_bits(full_out))
    if rows % 2 == 0:
        folded = dict(t, x=t["x"].reshape(2, rows // 2, hidden), ti=t["ti"].reshape(2, rows // 2))
        out, grads = run_some(folded, dout, NAMES)
        assert torch.equal(as_bits(out.reshape(rows, hidden)), as_bits(full_out))
        for name in NAMES:
            assert torch.equal(as_bits(grads[name].reshape(full[name].shape)), as_bits(full[name])), name


def test_row_alone_equals_row_in_batch(device):
    p, t, dout = case(device, 40, 70)
    out, grads = run(t, dout)
    for r in (0, 1, 33, 69):
        one = dict(t, x=t["x"][r:r + 1], ti=t["ti"][r:r + 1])
        out1, g1 = run(one, dout[r:r + 1])
        assert torch.equal(as_bits(out1[0]), as_bits(out[r]))
        assert torch.equal(as_bits(g1["x"][0]), as_bits(grads["x"][r]))


def test_parameter_gradients_repeat_and_unused_timestep_gets_zero(device):
    p, t, dout = case(device, 24, 90)
    first = run(t, dout)[1]
    second = run(t, dout)[1]
    for name in PARAMS:
        assert torch.equal(as_bits(first[name]), as_bits(second[name])), name
    t["ti"] = torch.zeros_like(t["ti"])  # timesteps 1 and 2 are never used: no gradient reaches their temb rows
    grads = run(t, dout)[1]
    assert torch.count_nonzero(grads["temb"][1:]) == 0 and torch.count_nonzero(grads["temb"][0]) > 0


def test_many_backward_programs_agree_with_float64(device, monkeypatch):
    """norm_modulate's backward in small chunks (programs that hold no row of some timestep still write
    zero partials): the gradients stay within the bound and repeat."""
    from h3bench.kernels import norm_modulate_kernel as NM

    p, t, dout = case(device, 24, 40, "float32")
    small = dataclasses.replace(NM.launch_config(24), chunk_limit=3)
    monkeypatch.setattr(NM, "launch_config", lambda hidden: small)
    out, grads = run(t, dout)
    ref = reference(p, t, dout)
    for name in NAMES:
        assert rel_err(grads[name], ref.grads[name]) <= tol(torch.float32), name
    again = run(t, dout)[1]
    for name in PARAMS:
        assert torch.equal(as_bits(grads[name]), as_bits(again[name])), name


def test_out_of_range_index(device):
    p, t, dout = case(device, 8, 5)
    bad = dict(t, ti=t["ti"].clone())
    bad["ti"][3] = 3
    with pytest.raises(IndexError, match=r"ti\[3\] = 3 is outside \[0, 3\)"):
        final_adaln_out(*bad.values(), EPS)
    bad["ti"][3] = -1
    with pytest.raises(IndexError, match="-1"):
        final_adaln_out(*bad.values(), EPS)
    out, grads = run(bad, dout, check_index=False)
    assert torch.isnan(out[3]).all() and torch.isfinite(out[[0, 1, 2, 4]]).all()
    keep = torch.tensor([0, 1, 2, 4], device=device)
    ref = reference(p, dict(t, x=t["x"][keep], ti=t["ti"][keep]), dout[keep])
    for name in PARAMS:  # the bad row adds nothing to the parameter gradients
        assert rel_err(grads[name], ref.grads[name]) <= tol(p.torch_dtype), name


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {"x": a["x"].tolist()}, TypeError, "x must be a torch.Tensor"),
    (lambda a: {"w": a["w"].double()}, TypeError, "w has dtype"),
    (lambda a: {"nw": a["nw"].int()}, TypeError, "nw has dtype"),
    (lambda a: {"b": a["b"].float()}, TypeError, "b has dtype"),
    (lambda a: {"temb": a["temb"].double()}, TypeError, "temb has dtype"),
    (lambda a: {"ti": a["ti"].float()}, TypeError, "ti has dtype"),
    (lambda a: {"x": a["x"].int()}, TypeError, "x has dtype"),
    (lambda a: {"b": a["b"].to("meta")}, ValueError, "b is on meta"),
    (lambda a: {"nw": a["nw"][:-1]}, ValueError, "nw must have shape"),
    (lambda a: {"w": a["w"][:, :-1]}, ValueError, "w must have shape"),
    (lambda a: {"b": a["b"][:-1]}, ValueError, "b must have shape"),
    (lambda a: {"temb": a["temb"][0]}, ValueError, "temb must be"),
    (lambda a: {"ti": a["ti"][:-1]}, ValueError, "ti must have shape"),
    (lambda a: {"temb": a["temb"][:0]}, ValueError, "temb has no rows"),
])
def test_bad_input_names_the_argument(device, change, error, match):
    _, t, _ = case(device, 8, 5)
    args = dict(t)
    args.update(change(args))
    with pytest.raises(error, match=match):
        final_adaln_out(*args.values(), EPS)
    # the one-predicate fast check never accepts what `_check` rejects (its device part needs CUDA:
    # on the CPU it is asked with device -1, which a meta tensor also reports)
    assert not FA._fast_ok(*args.values())
    if "meta" not in match:
        assert not FA._well_formed(*args.values(), -1)


@pytest.mark.parametrize("eps,error", [(float("nan"), ValueError), (-1.0, ValueError), ("x", TypeError)])
def test_bad_eps_is_refused(device, eps, error):
    _, t, _ = case(device, 8, 5)
    with pytest.raises(error, match="eps must be"):
        final_adaln_out(*t.values(), eps)


def test_fast_check_accepts_the_common_case(device):
    _, t, _ = case(device, 8, 5)
    assert FA._well_formed(*t.values(), t["x"].get_device())
    assert FA._fast_ok(*t.values()) == (device.type == "cuda")
    # what it leaves to `_check`: ti shaped like x's leading dims; x wider than norm_modulate's bound
    assert not FA._well_formed(*dict(t, x=t["x"].reshape(5, 1, 8), ti=t["ti"].reshape(5, 1)).values(), -1)
    wide = torch.empty(1, FA.NM.MAX_HIDDEN + 1, device=device)
    big = dict(t, x=wide.bfloat16(), nw=torch.ones(wide.shape[1], dtype=torch.bfloat16, device=device),
               w=torch.zeros(2 * wide.shape[1], 32, dtype=torch.bfloat16, device=device),
               b=torch.zeros(2 * wide.shape[1], dtype=torch.bfloat16, device=device), ti=t["ti"][:1])
    assert not FA._well_formed(*big.values(), -1)
    with pytest.raises(ValueError, match="this kernel supports H <="):
        final_adaln_out(*big.values(), EPS)


def test_quick_plan_through_the_runner(device):
    from h3bench.adapters.final_adaln_out.h3bench_triton import ADAPTER

    row = run_quick_plan("final_adaln_out", ADAPTER, device)  # batch-invariant, parameter gradients repeatable
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= tol(torch.bfloat16)
        assert max(size.grad_rel_err.values()) <= tol(torch.bfloat16)

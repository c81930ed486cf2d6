"""Our Triton GEMM ops (kernels/gemm.py, kernels/timestep_mlp_kernel.py, kernels/adaln_projection_kernel.py) against
float64, their batch invariance, the repeatability of their weight gradients, their argument errors,
and one quick plan through the runner per op.

On the CPU the kernels run under Triton's interpreter, where a dot is a fixed-order chain of fused
multiply-adds (kernels/interpreted_dot.py): the tests check the kernels' structure (masks, strides,
epilogues, split-K, the db column, one tile order for every T), not the GPU's FMA chains or wgmma, which
the GPU bench checks (tools/bench_gemm.py: one row alone against 2048 rows, bitwise, with the configs each
row count really gets)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.ops.adaln_projection import OP as ADA
from h3bench.harness.ops.adaln_projection import AdaLNProjectionParams
from h3bench.harness.ops.timestep_mlp import OP as MLP
from h3bench.harness.ops.timestep_mlp import TimestepMLPParams
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels import gemm
from h3bench.kernels.adaln_projection_api import adaln_projection
from h3bench.kernels.timestep_mlp_api import timestep_mlp
from h3bench.kernels.timestep_mlp_kernel import DX_SPLIT, MLPConfigs
from tests.helpers import gapped, run_quick_plan, within

# Odd widths: no K or N is a multiple of the interpreter's tiles (32 x 64 x 32).
MLP_PARAMS = TimestepMLPParams(freq_dim=20, hidden=37, temb_dim=29)
ADA_PARAMS = AdaLNProjectionParams(hidden=5, temb_dim=23, chunks=6, modalities=3)   # table width 90
MLP_NAMES = MLP.input_names
ADA_NAMES = ADA.input_names
U32 = 2.0 ** -24
# fp32 (timestep_mlp, and adaln's dtemb): every value is a few dot products of at most 37 terms, each a
# chain of fp32 fma's. The classical bound is ~n u times the cancellation; for these random draws the
# observed max|err| / max|ref| is 1e-7 .. 3e-7, and at the model's size cuBLAS's fp32 sits at ~1e-6.
# 16 u = 9.5e-7 keeps 3x room and still fails anything with a TF32 product (u = 2^-11 = 4.9e-4) or a
# bf16 rounding (2^-9) by two orders of magnitude.
FP32_TOL = 16 * U32
BF16_U = 2.0 ** -8   # bf16 keeps 8 significant bits: a rounding moves a value by at most 2^-8 of it


def mlp_case(device, rows, seed=3):
    inputs = MLP.make_inputs(MLP_PARAMS, rows, seed, device)
    return inputs, MLP.make_grad_outs(MLP_PARAMS, rows, seed + 100, device)[0]


def ada_case(device, rows, seed=3):
    inputs = ADA.make_inputs(ADA_PARAMS, rows, seed, device)
    return inputs, ADA.make_grad_outs(ADA_PARAMS, rows, seed + 100, device)[0]


def run_op(fn, names, inputs, grad_out):
    leaves = [inputs.tensors[n].detach().requires_grad_() for n in names]
    y = fn(*leaves)
    y.backward(grad_out)
    return y.detach(), {n: leaf.grad for n, leaf in zip(names, leaves)}


# --- against float64 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 3, 17, 70])
def test_timestep_mlp_matches_float64(device, rows):
    inputs, dy = mlp_case(device, rows)
    y, grads = run_op(timestep_mlp, MLP_NAMES, inputs, dy)
    ref = MLP.reference(MLP_PARAMS, inputs, (dy,), MLP_NAMES, MLP.name)
    assert y.dtype == torch.float32 and y.shape == (rows, MLP_PARAMS.temb_dim)
    assert rel_err(y, ref.outputs[0]) <= FP32_TOL
    for name in MLP_NAMES:
        assert grads[name].shape == inputs.tensors[name].shape and grads[name].dtype == torch.float32, name
        assert rel_err(grads[name], ref.grads[name]) <= FP32_TOL, name


@pytest.mark.parametrize("rows", [1, 16, 17, 70])
def test_timestep_mlp_gpu_default_plumbing_matches_float64(device, monkeypatch, rows):
    """The GPU's default configs run through the launchers (the interpreter's dots stand in for tf32x3 and
    fp64 MMA): GEMM1 in float64, GEMM2 in fp16x3 with each step's scales (swapped and paired up to 16 rows),
    dz1 in fp16x3 with the row maxima shared by forward and backward, the fixed K chunks, dx's K-major
    copies, the float64 column sums, the T <= 16 / <= 64 / > 64 weight-gradient tiers. Values against
    float64, weight gradients twice, the no-grad forward's bits."""
    from h3bench.kernels import timestep_mlp_kernel as TM

    monkeypatch.setattr(TM, "configs", lambda: TM.DEFAULT)
    inputs, dy = mlp_case(device, rows)
    y, grads = run_op(timestep_mlp, MLP_NAMES, inputs, dy)
    ref = MLP.reference(MLP_PARAMS, inputs, (dy,), MLP_NAMES, MLP.name)
    assert rel_err(y, ref.outputs[0]) <= FP32_TOL
    for name in MLP_NAMES:
        assert rel_err(grads[name], ref.grads[name]) <= FP32_TOL, name
    _, again = run_op(timestep_mlp, MLP_NAMES, inputs, dy)
    for name in ("w1", "b1", "w2", "b2"):
        assert torch.equal(as_bits(again[name]), as_bits(grads[name])), name
    with torch.no_grad():   # the no-grad forward (its own launches where the configs allow): the same bits
        y_plain = timestep_mlp(*(inputs.tensors[n] for n in MLP_NAMES))
    assert torch.equal(as_bits(y_plain), as_bits(y))


def _silu64(t):
    t = t.double()
    return t * torch.sigmoid(t)


@pytest.mark.parametrize("rows", [1, 3, 17, 70])
def test_adaln_projection_matches_float64(device, rows):
    """bf16 bounds, element by element: a = bf16(silu(temb)) is off by at most 2^-8 of each element,
    which moves a product sum by at most 2^-8 * sum |terms|; the one rounding of the output adds
    2^-8 |ref|; fp32 accumulation adds ~n u (1e-6 of max|ref| covers it).
    dtemb is fp32 (dy W is never rounded to bf16): the fp32 bound."""
    inputs, dy = ada_case(device, rows)
    y, grads = run_op(adaln_projection, ADA_NAMES, inputs, dy)
    ref = ADA.reference(ADA_PARAMS, inputs, (dy,), ADA_NAMES, ADA.name)
    t = inputs.tensors
    a64 = _silu64(t["temb"]).abs()
    w64, dy64 = t["w"].double(), dy.double()
    assert y.dtype == torch.bfloat16 and y.shape == (rows, ADA_PARAMS.out_features)

    def within_bf16(out, expected, terms):
        return within(out, expected, BF16_U * (terms + expected.abs()) + 1e-6 * expected.abs().max())

    assert within_bf16(y, ref.outputs[0], a64 @ w64.abs().T)
    assert within_bf16(grads["w"], ref.grads["w"], dy64.abs().T @ a64)
    assert within_bf16(grads["b"], ref.grads["b"], torch.zeros_like(ref.grads["b"]))
    assert grads["temb"].dtype == torch.float32 and rel_err(grads["temb"], ref.grads["temb"]) <= FP32_TOL
    assert grads["w"].dtype == grads["b"].dtype == torch.bfloat16


def test_zero_rows(device):
    for fn, names, (inputs, dy), out_width in (
            (timestep_mlp, MLP_NAMES, mlp_case(device, 0), MLP_PARAMS.temb_dim),
            (adaln_projection, ADA_NAMES, ada_case(device, 0), ADA_PARAMS.out_features)):
        y, grads = run_op(fn, names, inputs, dy)
        assert y.shape == (0, out_width)
        assert grads[names[0]].shape == (0, inputs.tensors[names[0]].shape[1])
        for name in names[1:]:
            assert grads[name].shape == inputs.tensors[name].shape and torch.count_nonzero(grads[name]) == 0, name


# --- batch invariance and repeatability ----------------------------------------------------------------

@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_rows_alone_and_in_sub_batches_equal_the_full_batch(device, op):
    """Rows 0..69 (three 32-row tiles under the interpreter, the last partial): each row alone and each
    sub-batch gives the same bits as in the full batch, for the output and the per-row gradient."""
    fn, names, (inputs, dy) = ((timestep_mlp, MLP_NAMES, mlp_case(device, 70)) if op == "timestep_mlp"
                               else (adaln_projection, ADA_NAMES, ada_case(device, 70)))
    y, grads = run_op(fn, names, inputs, dy)
    row_name = names[0]
    for lo, hi in ((0, 1), (31, 32), (32, 33), (69, 70), (0, 3), (0, 17), (5, 38), (30, 70), (0, 32)):
        sub = inputs.select_rows(torch.arange(lo, hi, device=device))
        y_sub, g_sub = run_op(fn, names, sub, dy[lo:hi])
        assert torch.equal(as_bits(y_sub), as_bits(y[lo:hi])), (lo, hi)
        assert torch.equal(as_bits(g_sub[row_name]), as_bits(grads[row_name][lo:hi])), (lo, hi)


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_strided_inputs_give_the_contiguous_bits(device, op):
    """Every input a strided view (no unit stride, NaN between its elements): output and every gradient
    bitwise those of contiguous inputs (a strided bias was once read as if contiguous)."""
    fn, names, (inputs, dy) = ((timestep_mlp, MLP_NAMES, mlp_case(device, 5)) if op == "timestep_mlp"
                               else (adaln_projection, ADA_NAMES, ada_case(device, 5)))
    y, grads = run_op(fn, names, inputs, dy)
    strided = dataclasses.replace(inputs, tensors={n: gapped(t) for n, t in inputs.tensors.items()})
    for name, t in strided.tensors.items():
        assert torch.equal(t, inputs.tensors[name]) and (t.dim() == 1 or 1 not in t.stride()), name
    ys, grads_s = run_op(fn, names, strided, dy)
    assert torch.equal(as_bits(ys), as_bits(y))
    for name in names:
        assert torch.equal(as_bits(grads_s[name]), as_bits(grads[name])), name


def test_default_no_grad_forward_is_two_launches(device, monkeypatch):
    """Under the GPU's default configs a no-grad timestep_mlp call takes the two-launch recipe (GEMM1, GEMM2
    with local scales, not through `gemm.forward`): no `row_maxima`, no other launch; a strided bias falls
    back to the general path (`gemm.forward`, which reads it contiguous), with the same two GEMM launches.
    The same bits as the autograd path either way."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    from h3bench.kernels.gemm import _gemm_kernel
    monkeypatch.setattr(TM, "configs", lambda: TM.DEFAULT)
    inputs, dy = mlp_case(device, 3)
    for strided in (False, True):
        args = [inputs.tensors[n] for n in MLP_NAMES]
        if strided:
            args[4] = gapped(args[4])
        seen, general = [], []
        real, real_forward = gemm.launch_keyed, gemm.forward
        monkeypatch.setattr(gemm, "launch_keyed", lambda kernel, *a, **k: (seen.append(kernel), real(kernel, *a, **k)))
        monkeypatch.setattr(gemm, "forward", lambda *a, **k: (general.append(1), real_forward(*a, **k))[1])
        with torch.no_grad():
            y = timestep_mlp(*args)
        monkeypatch.setattr(gemm, "launch_keyed", real)
        monkeypatch.setattr(gemm, "forward", real_forward)
        assert seen == [_gemm_kernel, _gemm_kernel] and bool(general) == strided, (strided, seen, general)
        y_grad, _ = run_op(timestep_mlp, MLP_NAMES, inputs, dy)
        assert torch.equal(as_bits(y), as_bits(y_grad)), strided


def test_inference_path_matches_autograd_path(device):
    """No grad: no autograd node, no kept pre-activation, no ones column; the same bits."""
    for fn, names, (inputs, dy) in ((timestep_mlp, MLP_NAMES, mlp_case(device, 19)),
                                    (adaln_projection, ADA_NAMES, ada_case(device, 19))):
        y, _ = run_op(fn, names, inputs, dy)
        with torch.no_grad():
            y_plain = fn(*(inputs.tensors[n] for n in names))
        assert torch.equal(as_bits(y_plain), as_bits(y))


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_weight_gradients_repeat_bitwise(device, op):
    """dW and db are sums over the rows in a fixed order: the same bits run after run. (They are not
    claimed independent of T or of the rows' order: a sum over rows depends on which rows it adds.)"""
    fn, names, (inputs, dy) = ((timestep_mlp, MLP_NAMES, mlp_case(device, 41)) if op == "timestep_mlp"
                               else (adaln_projection, ADA_NAMES, ada_case(device, 41)))
    _, first = run_op(fn, names, inputs, dy)
    _, second = run_op(fn, names, inputs, dy)
    for name in names[1:]:
        assert torch.equal(as_bits(first[name]), as_bits(second[name])), name


# --- the building blocks ----------------------------------------------------------------------------------

def test_split_k_adds_its_chunks_in_order(device):
    """input_grad with SPLIT_K = 3 over K = 300 (chunks of k_chunk(300, 3) = 128: [0,128), [128,256),
    [256,300)) equals the three chunk products, each by the same kernel unsplit, added in chunk order."""
    g = torch.Generator(device=device).manual_seed(5)
    dy = torch.randn(21, 300, generator=g, device=device)
    w = torch.randn(300, 19, generator=g, device=device)
    z = torch.randn(21, 19, generator=g, device=device)
    cfg = gemm.LaunchConfig(16, 16, 16, split_k=3)
    assert gemm.k_chunk(300, 3) == 128
    split = gemm.input_grad(dy, w, cfg)
    one = dataclasses.replace(cfg, split_k=1)
    parts = [gemm.input_grad(dy[:, lo:hi], w[lo:hi], one) for lo, hi in ((0, 128), (128, 256), (256, 300))]
    assert torch.equal(as_bits(split), as_bits(parts[0] + parts[1] + parts[2]))
    assert rel_err(split, dy.double() @ w.double()) <= FP32_TOL
    # the silu' epilogue runs on the sum, once
    with_z = gemm.input_grad(dy, w, cfg, dsilu_of=z)
    s = torch.sigmoid(z.double())
    assert rel_err(with_z, (dy.double() @ w.double()) * s * (1 + z.double() * (1 - s))) <= FP32_TOL


def test_silu_cast_ones_column(device):
    """silu_cast's ones_column: a [T, D] view of rows padded to 16 elements, column D ones (the db column)."""
    inputs, _ = ada_case(device, 23)
    t = inputs.tensors
    a = gemm.silu_cast(t["temb"], torch.bfloat16, ones_column=True)
    assert a.shape == t["temb"].shape and a.stride(0) == 32   # 23 + 1 rounded up to 16
    ones = a.as_strided((23,), (a.stride(0),), a.storage_offset() + a.shape[1])   # the db column
    assert torch.equal(ones.float(), torch.ones(23, device=device))
    assert torch.equal(as_bits(a), as_bits(gemm.silu_cast(t["temb"], torch.bfloat16)))


def test_weight_grad_db_column_virtual_and_stored_agree(device):
    """db is the GEMM's extra column of ones, read from silu_cast's buffer or made in the kernel."""
    inputs, dy = ada_case(device, 37)
    a = gemm.silu_cast(inputs.tensors["temb"], torch.bfloat16, ones_column=True)
    cfg = gemm.LaunchConfig(16, 32, 16)
    dw_s, db_s = gemm.weight_grad(dy, a, cfg, a_ones="stored", dw_dtype=torch.bfloat16, db_dtype=torch.bfloat16)
    dw_v, db_v = gemm.weight_grad(dy, a.contiguous(), cfg, a_ones="virtual", dw_dtype=torch.bfloat16,
                                  db_dtype=torch.bfloat16)
    assert torch.equal(as_bits(dw_s), as_bits(dw_v)) and torch.equal(as_bits(db_s), as_bits(db_v))
    dw_only, none = gemm.weight_grad(dy, a, cfg, dw_dtype=torch.bfloat16, db_dtype=None)
    assert none is None and torch.equal(as_bits(dw_only), as_bits(dw_s))
    assert rel_err(db_s, dy.double().sum(0)) <= BF16_U


def test_column_sums_bias_gradient_is_close_to_float64_and_repeats(device):
    """timestep_mlp's bias gradients: dy's column sums in float64 (128-row tl.sum trees added in order) and
    rounded once: the correctly rounded sum, where a one-chain db (the dW GEMM's ones column on the GPU,
    written out here as the sequential sum it is there) errs ~1.2e-6 at T = 2048. Repeats bitwise; a
    strided dy gives the same bits; zero rows give zeros; 16-bit outputs are refused (one rounding from
    float64 is not what `rounded` does)."""
    from h3bench.kernels.timestep_mlp_kernel import _bias_grad

    g = torch.Generator().manual_seed(5)
    dy = (torch.randn(2048, 48, generator=g) + 0.5).to(device)   # a non-zero mean: the sums grow
    db = gemm.column_sums(dy, torch.float32)
    ref = dy.double().sum(0)
    chain = torch.zeros(48, dtype=torch.float32, device=device)
    for row in dy:  # one rounding per row, as the ones column's fma chain on the GPU
        chain = chain + row
    assert rel_err(db, ref) <= U32 < rel_err(chain, ref)
    # ours and torch's float64 sums differ by ~2^-40 of a term at most, far below an fp32 ulp: rounded
    # once, they give the same fp32 sums (for this seed, no sum lies that close to a rounding tie)
    assert torch.equal(as_bits(db), as_bits(ref.float()))
    with pytest.raises(ValueError, match="float32"):
        gemm.column_sums(dy, torch.bfloat16)
    assert torch.equal(as_bits(gemm.column_sums(dy, torch.float32)), as_bits(db))
    assert torch.equal(as_bits(_bias_grad(dy.t().contiguous().t())), as_bits(db))
    assert torch.equal(gemm.column_sums(dy[:0], torch.float32), torch.zeros(48, device=device))


def test_tiers_and_configs_are_checked():
    a, b = gemm.LaunchConfig(4, 16, 64), gemm.LaunchConfig(64, 64, 32)
    tiers = ((4, a), (1 << 40, b))
    assert gemm.pick(tiers, 1) is a and gemm.pick(tiers, 4) is a and gemm.pick(tiers, 5) is b
    with pytest.raises(ValueError, match="power of two"):
        gemm.LaunchConfig(48, 16, 16)
    with pytest.raises(ValueError, match="KALIGN"):
        gemm.LaunchConfig(16, 16, 256, split_k=2)
    good_dx = ((1 << 40, gemm.LaunchConfig(16, 16, 16, split_k=DX_SPLIT)),)
    with pytest.raises(ValueError, match="split_k"):
        MLPConfigs(fwd1=tiers, fwd2=tiers, dh=tiers, dw2=tiers, dw1=tiers,
                   dx=((1 << 40, gemm.LaunchConfig(16, 16, 16, split_k=2)),))
    MLPConfigs(fwd1=tiers, fwd2=tiers, dh=tiers, dw2=tiers, dw1=tiers, dx=good_dx)


def test_tensor_core_and_persistent_configs_are_checked():
    from h3bench.kernels import timestep_mlp_kernel as TM

    with pytest.raises(ValueError, match="precision"):
        gemm.LaunchConfig(64, 64, 32, precision="tf32")
    with pytest.raises(ValueError, match="persistent"):
        gemm.LaunchConfig(64, 64, 32, split_k=2, persistent=True)
    t3 = gemm.LaunchConfig(64, 64, 32, precision="tf32x3")
    other = gemm.LaunchConfig(64, 128, 32, precision="tf32x3")
    dx = ((1 << 40, gemm.LaunchConfig(64, 64, 32, split_k=DX_SPLIT, precision="tf32x3")),)
    one = ((1 << 40, t3),)
    with pytest.raises(ValueError, match="one config for every row count"):
        MLPConfigs(fwd1=((4, other), (1 << 40, t3)), fwd2=one, dh=one, dw2=one, dw1=one, dx=dx)
    # weight gradients reduce over T by nature: their tiers may differ
    MLPConfigs(fwd1=one, fwd2=one, dh=one, dw2=((4, other), (1 << 40, t3)), dw1=one, dx=dx)
    assert {cfg.precision for _, cfg in TM.DEFAULT.dx} == {"tf32x3"} and len(TM.DEFAULT.dh) == 1
    split = gemm.LaunchConfig(64, 64, 32, split_k=8)
    MLPConfigs(fwd1=one, fwd2=((1 << 40, split),), dh=one, dw2=one, dw1=one, dx=dx)
    with pytest.raises(ValueError, match="fwd2's split_k"):   # a split is part of the order, like a tile
        MLPConfigs(fwd1=one, fwd2=((4, gemm.LaunchConfig(64, 64, 32)), (1 << 40, split)), dh=one, dw2=one,
                   dw1=one, dx=dx)
    with pytest.raises(ValueError, match="no split-K"):
        MLPConfigs(fwd1=((1 << 40, split),), fwd2=one, dh=one, dw2=one, dw1=one, dx=dx)
    MLPConfigs(fwd1=one, fwd2=one, dh=((1 << 40, split),), dw2=one, dw1=one, dx=dx)   # dz1 too: one split
    with pytest.raises(ValueError, match="dh's split_k"):
        MLPConfigs(fwd1=one, fwd2=one, dh=((4, gemm.LaunchConfig(64, 64, 32)), (1 << 40, split)), dw2=one,
                   dw1=one, dx=dx)
    # a weight gradient may split T (its order is one per T anyway)
    MLPConfigs(fwd1=one, fwd2=one, dh=one, dw2=one, dw1=((1 << 40, gemm.LaunchConfig(64, 64, 32, split_k=4)),), dx=dx)


def test_fp64_gemm_rounds_once_from_float64(device):
    """precision="fp64": float64 products and sums and a float64 epilogue (bias, silu), one rounding per
    output: z and silu(z) within half an ulp of the float64 reference (bitwise equal to it rounded, but
    for the rare sum within ~2^-50 of a rounding tie), a row alone bitwise equal to it in the batch, the
    weight gradient within fp32's bound. fp64 takes no split-K; one config for every row count."""
    from h3bench.kernels import timestep_mlp_kernel as TM

    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 256, generator=g).to(device)
    w = (torch.randn(70, 256, generator=g) / 16).to(device)
    b = torch.randn(70, generator=g).to(device)
    cfg = gemm.LaunchConfig(32, 64, 32, precision="fp64")
    h, z = gemm.forward(x, w, b, cfg, out_dtype=torch.float32, out_silu=True, save_pre=True)
    z_ref = x.double() @ w.double().T + b.double()
    h_ref = z_ref * torch.sigmoid(z_ref)
    for got, ref in ((z, z_ref), (h, h_ref)):
        half_ulp = torch.abs(ref.float()).double() * U32   # half an ulp is 2^-24 relative at most
        assert bool(((got.double() - ref).abs() <= half_ulp * 1.0001 + 1e-45).all())
        assert (got != ref.float()).sum() <= 1   # a correctly rounded sum misses only at a near-tie
    h1, _ = gemm.forward(x[5:6], w, b, cfg, out_dtype=torch.float32, out_silu=True, save_pre=True)
    assert torch.equal(as_bits(h1[0]), as_bits(h[5]))
    dy = torch.randn(37, 70, generator=g).to(device)
    dw, _ = gemm.weight_grad(dy, x, cfg, dw_dtype=torch.float32, db_dtype=None)
    assert rel_err(dw, dy.double().T @ x.double()) <= U32
    with pytest.raises(ValueError, match="fp64 config takes no split-K"):
        gemm.LaunchConfig(64, 64, 32, split_k=2, precision="fp64")
    # fp64 tiers may differ in tile, warps and stages (the MMA's k-ordered chain: bitwise on the
    # H200), never in the step (block_k) or the precision
    dataclasses.replace(TM.DEFAULT, fwd1=((4, gemm.LaunchConfig(16, 8, 32, num_warps=1, precision="fp64")),
                                          (1 << 40, gemm.LaunchConfig(64, 64, 32, precision="fp64"))))
    for other in (gemm.LaunchConfig(64, 64, 64, precision="fp64"), gemm.LaunchConfig(64, 64, 32)):
        with pytest.raises(ValueError, match="one config for every row count"):
            dataclasses.replace(TM.DEFAULT, fwd1=((4, cfg), (1 << 40, other)))
    assert all(c.precision == "fp64" for _, c in TM.DEFAULT.fwd1)


FP16X3 = gemm.LaunchConfig(32, 64, 32, precision="fp16x3")


@pytest.mark.parametrize("local", [False, True], ids=["row_maxima", "local_scales"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_fp16x3_gemms_match_float64_and_a_row_alone(device, split_k, local):
    """precision="fp16x3" (three fp16 products a step, power-of-two scaled operands, from row maxima or
    each step's tiles): forward, input and weight gradient within fp32's bound of float64 at odd sizes;
    a row alone bitwise equal to it in the batch (its scale is its own row's); the weight gradient twice
    bitwise."""
    cfg = dataclasses.replace(FP16X3, split_k=split_k, local_scales=local)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(37, 300, generator=g).to(device)
    w = (torch.randn(70, 300, generator=g) / 40).to(device)
    b = torch.randn(70, generator=g).to(device)
    y, _ = gemm.forward(a, w, b, cfg, out_dtype=torch.float32)
    assert rel_err(y, a.double() @ w.double().T + b.double()) <= FP32_TOL
    y1, _ = gemm.forward(a[11:12], w, b, cfg, out_dtype=torch.float32)
    assert torch.equal(as_bits(y1[0]), as_bits(y[11]))
    dy = torch.randn(37, 70, generator=g).to(device)
    z = torch.randn(37, 300, generator=g).to(device)
    dx = gemm.input_grad(dy, w, cfg, dsilu_of=z)
    s = torch.sigmoid(z.double())
    assert rel_err(dx, (dy.double() @ w.double()) * (s * (1 + z.double() * (1 - s)))) <= FP32_TOL
    dx1 = gemm.input_grad(dy[3:4], w, cfg, dsilu_of=z[3:4])
    assert torch.equal(as_bits(dx1[0]), as_bits(dx[3]))
    dw, _ = gemm.weight_grad(dy, a, cfg, dw_dtype=torch.float32, db_dtype=None)
    assert rel_err(dw, dy.double().T @ a.double()) <= FP32_TOL
    dw2, _ = gemm.weight_grad(dy, a, cfg, dw_dtype=torch.float32, db_dtype=None)
    assert torch.equal(as_bits(dw2), as_bits(dw))


@pytest.mark.parametrize("local", [False, True], ids=["row_maxima", "local_scales"])
def test_fp16x3_scales_reach_fp32_range_and_propagate_nonfinite(device, local):
    """Rows 1e-30 and 1e25 times the others (far outside fp16's range unscaled) and a zero row: each row's
    error within fp32's bound of its own size; a NaN or an inf in a row makes that row's outputs
    non-finite, as in fp32, and leaves the other rows' bits alone. With local scales also a row whose
    k blocks differ by 1e-35 (the smallest block's scale and its inverse at the clamp, both normal)."""
    cfg = dataclasses.replace(FP16X3, local_scales=local)
    g = torch.Generator().manual_seed(6)
    a = torch.randn(6, 200, generator=g)
    a[0] *= 1e-30
    a[1] *= 1e25
    a[2] = 0.0
    a[3, :32] *= 1e-35
    a = a.to(device)
    w = (torch.randn(40, 200, generator=g) * 1e-6).to(device)
    y, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    ref = a.double() @ w.double().T
    for r in (0, 1, 3, 4, 5):
        assert rel_err(y[r], ref[r]) <= FP32_TOL, r
    assert torch.equal(y[2], torch.zeros_like(y[2]))
    bad = a.clone()
    bad[4, 7] = float("nan")
    bad[5, 9] = float("inf")
    yb, _ = gemm.forward(bad, w, None, cfg, out_dtype=torch.float32)
    assert not torch.isfinite(yb[4]).any() and not torch.isfinite(yb[5]).any()
    assert torch.equal(as_bits(yb[:4]), as_bits(y[:4]))


def test_local_scales_need_no_maxima_and_only_fp16x3_takes_them(device, monkeypatch):
    """A local-scales fp16x3 GEMM launches no `row_maxima` (its scales are each step's) and refuses maxima
    passed in; `local_scales` on another precision is refused."""
    cfg = dataclasses.replace(FP16X3, local_scales=True)
    assert not gemm.needs_maxima(cfg) and gemm.needs_maxima(FP16X3)
    with pytest.raises(ValueError, match="local_scales is an fp16x3 option"):
        gemm.LaunchConfig(32, 64, 32, precision="tf32x3", local_scales=True)
    g = torch.Generator().manual_seed(8)
    a = torch.randn(5, 70, generator=g).to(device)
    w = torch.randn(9, 70, generator=g).to(device)
    called = []
    monkeypatch.setattr(gemm, "row_maxima", lambda *t: called.append(t))
    y, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    assert not called and rel_err(y, a.double() @ w.double().T) <= FP32_TOL
    with pytest.raises(ValueError, match="unless its scales are local"):
        gemm._gemm(a, (a.stride(0), a.stride(1)), w, (w.stride(1), w.stride(0)), y, (y.stride(0), y.stride(1)),
                   5, 9, 70, cfg, scales=gemm.Scales(a.abs().amax(1), w.abs().amax(1)))


def test_split_k_counters_are_left_zeroed_and_reused(device):
    """The split-K tile counters (one buffer per device and stream) are back at 0 after every launch, so the
    next launch finds them ready: two launches in a row give the same bits, the buffer is not reallocated."""
    cfg = gemm.LaunchConfig(32, 32, 32, split_k=3)
    g = torch.Generator().manual_seed(9)
    a = torch.randn(40, 400, generator=g).to(device)
    w = torch.randn(70, 400, generator=g).to(device)
    y, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    counters = gemm.split_counters(a.device, 1)
    assert counters.dtype == torch.int32 and not counters.any()
    y2, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    assert gemm.split_counters(a.device, 1) is counters and not counters.any()
    assert torch.equal(as_bits(y2), as_bits(y)) and rel_err(y, a.double() @ w.double().T) <= FP32_TOL


def test_fp16x3_configs_and_row_maxima(device):
    """fp16x3 reads its operands as they are (no K-major copies), makes no db column (its caller takes column
    sums); `row_maxima` is exact, for one tensor or two in one launch."""
    with pytest.raises(ValueError, match="reads its operands as they are"):
        gemm.LaunchConfig(64, 64, 32, precision="fp16x3", k_major=True)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(9, 50, generator=g).to(device)
    w = torch.randn(12, 50, generator=g).to(device)
    dy = torch.randn(9, 12, generator=g).to(device)
    with pytest.raises(ValueError, match="makes no db column"):
        gemm.weight_grad(dy, a, FP16X3, dw_dtype=torch.float32, db_dtype=torch.float32)
    ma, mw = gemm.row_maxima(a[:, 3:], w)
    assert torch.equal(ma, a[:, 3:].abs().amax(1)) and torch.equal(mw, w.abs().amax(1))
    (only, none) = gemm.row_maxima(w)
    assert torch.equal(only, mw) and none is None
    with pytest.raises(ValueError, match="unit inner stride"):
        gemm.row_maxima(a.T)
    with pytest.raises(ValueError, match="fp32"):
        gemm.row_maxima(a.double())


@pytest.mark.parametrize("precision", ["ieee", "tf32x3", "fp16x3"])
def test_a_launch_key_tells_aligned_from_unaligned_operands(device, precision):
    """`launch_keyed` reuses a compiled GEMM by the caller's key (kernels/common.py): an operand 4 bytes off
    16-byte alignment, the same shapes and strides as an aligned one, must not take the aligned launch's
    kernel (on the GPU that kernel's vector loads would fault or read wrong data). Both within fp32's
    bound of float64, each twice (the second call through the key)."""
    cfg = gemm.LaunchConfig(64, 64, 32, precision=precision)
    g = torch.Generator().manual_seed(8)
    buf = torch.randn(48, 97, generator=g).to(device)
    w = (torch.randn(40, 96, generator=g) / 10).to(device)
    maxima_w = gemm.row_maxima(w)[0]
    for a in (buf[:, :96], buf[:, 1:]):   # row stride 97 both times: only the pointer's alignment differs
        assert a.stride() == (97, 1)
        for _ in range(2):
            y, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32, w_max=maxima_w)
            assert rel_err(y, a.double() @ w.double().T) <= FP32_TOL


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_keyed_launches_match_triton_launches(device, monkeypatch, op):
    """kernels/common.py's `launch_keyed` calls a compiled GEMM by the caller's key after the first launch:
    outputs and gradients bitwise those of triton's own launch path, twice (the second through the key)."""
    if device.type != "cuda":
        pytest.skip("on the CPU the interpreter always takes triton's own launch: compared on a GPU only")
    from h3bench.kernels import common

    fn, names, case = ((timestep_mlp, MLP_NAMES, mlp_case) if op == "timestep_mlp"
                       else (adaln_projection, ADA_NAMES, ada_case))
    inputs, dy = case(device, 70)
    results = []
    for enabled in (False, True, True):
        monkeypatch.setattr(common, "ENABLED", enabled)
        results.append(run_op(fn, names, inputs, dy))
    for y, grads in results[1:]:
        assert torch.equal(as_bits(y), as_bits(results[0][0]))
        for name in names:
            assert torch.equal(as_bits(grads[name]), as_bits(results[0][1][name])), name


@pytest.mark.parametrize("k_major", [False, True])
def test_input_grad_split_with_dsilu(device, k_major):
    """dz1's split (fixed K chunks of 128, the last one short) with the silu' epilogue in the last
    chunk's program: within fp32's bound of float64; a row alone bitwise equal to it in the batch."""
    g = torch.Generator().manual_seed(8)
    dy = torch.randn(37, 300, generator=g).to(device)
    w = torch.randn(300, 45, generator=g).to(device)
    z = torch.randn(37, 45, generator=g).to(device)
    cfg = gemm.LaunchConfig(32, 64, 32, split_k=3, k_major=k_major, precision="tf32x3" if k_major else "ieee")
    dz = gemm.input_grad(dy, w, cfg, dsilu_of=z)
    s = torch.sigmoid(z.double())
    assert rel_err(dz, (dy.double() @ w.double()) * (s * (1 + z.double() * (1 - s)))) <= FP32_TOL
    one = gemm.input_grad(dy[20:21], w, cfg, dsilu_of=z[20:21])
    assert torch.equal(as_bits(one[0]), as_bits(dz[20]))


def test_weight_grad_split_over_t(device):
    """A weight gradient split over T (chunks of 128 rows, the last one short): within fp32's bound of
    float64 with the db column made in the kernel's last chunk; repeats bitwise."""
    g = torch.Generator().manual_seed(6)
    dy = torch.randn(300, 45, generator=g).to(device)
    a = torch.randn(300, 33, generator=g).to(device)
    cfg = gemm.LaunchConfig(32, 64, 32, split_k=3)
    dw, db = gemm.weight_grad(dy, a, cfg, dw_dtype=torch.float32, db_dtype=torch.float32)
    assert rel_err(dw, dy.double().T @ a.double()) <= FP32_TOL
    assert rel_err(db, dy.double().sum(0)) <= FP32_TOL
    again = gemm.weight_grad(dy, a, cfg, dw_dtype=torch.float32, db_dtype=torch.float32)
    assert torch.equal(as_bits(again[0]), as_bits(dw)) and torch.equal(as_bits(again[1]), as_bits(db))


@pytest.mark.parametrize("dtype,precision", [(torch.float32, "ieee"), (torch.float32, "tf32x3"),
                                             (torch.bfloat16, "ieee")])   # precision is an fp32 option
def test_persistent_launch_equals_the_plain_one(device, dtype, precision):
    """A persistent launch (programs looping over the tiles: 3 under the interpreter) computes every tile
    as the one-tile-a-program launch does, bitwise: forward (bias, masked rows and columns), input
    gradient with silu' (also on a K-major copy of W), weight gradient with the db column; tf32x3 stays
    within fp32's bound of float64."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(37, 100, generator=g).to(dtype).to(device)
    w = torch.randn(70, 100, generator=g).to(dtype).to(device)
    b = torch.randn(70, generator=g).to(dtype).to(device)
    dy = torch.randn(37, 70, generator=g).to(dtype).to(device)
    z = torch.randn(37, 100, generator=g).to(device)

    def outputs(cfg, k_major=False):
        y, _ = gemm.forward(a, w, b, cfg, out_dtype=torch.float32)
        dx = gemm.input_grad(dy, w, dataclasses.replace(cfg, k_major=k_major), dsilu_of=z)
        dw, db = gemm.weight_grad(dy, a, cfg, dw_dtype=dtype, db_dtype=dtype)
        return y, dx, dw, db

    tile = dict(block_m=64, block_n=32, block_k=32, precision=precision)
    plain = outputs(gemm.LaunchConfig(**tile))
    expect = a.double() @ w.double().T + b.double()
    assert rel_err(plain[0], expect) <= (FP32_TOL if dtype == torch.float32 else BF16_U)
    s = torch.sigmoid(z.double())
    dx_expect = (dy.double() @ w.double()) * (s * (1 + z.double() * (1 - s)))
    assert rel_err(plain[1], dx_expect) <= (FP32_TOL if dtype == torch.float32 else BF16_U)
    for persistent, k_major in ((True, False), (False, True), (True, True)):
        for got, want in zip(outputs(gemm.LaunchConfig(**tile, persistent=persistent), k_major), plain):
            assert torch.equal(as_bits(got), as_bits(want)), (persistent, k_major)


def test_k_major_is_an_input_gradient_option(device):
    """k_major copies W for `input_grad`; the forward and the weight gradient refuse it (no copy made there)."""
    cfg = gemm.LaunchConfig(32, 32, 32, precision="tf32x3", k_major=True)
    a, w, dy = torch.randn(3, 40).to(device), torch.randn(20, 40).to(device), torch.randn(3, 20).to(device)
    with pytest.raises(ValueError, match="input-gradient option"):
        gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="input-gradient option"):
        gemm.forward_plan(3, a.stride(), w, None, cfg)
    with pytest.raises(ValueError, match="input-gradient option"):
        gemm.weight_grad(dy, a, cfg, dw_dtype=torch.float32, db_dtype=None)


def _record_launches(monkeypatch) -> list[dict]:
    """Every `_gemm_kernel` launch's sizes and flags, the launch itself still made."""
    seen = []
    real = gemm.launch_keyed

    def spy(kernel, grid, device, key, args, meta):
        if kernel is gemm._gemm_kernel:
            named = dict(zip(kernel.arg_names, args))   # by name: the signature grows
            seen.append(dict({k: named[k] for k in ("M", "N", "K", "n_main", "n_load")}, **meta))
        real(kernel, grid, device, key, args, meta)
    monkeypatch.setattr(gemm, "launch_keyed", spy)
    return seen


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_unmasked_loads_stay_inside_b(device, monkeypatch, op):
    """A load without its column mask must not reach past B's last column, in any column tile of the
    grid. Widths that the tile divides, plus the db column, once broke this (an illegal address on the
    H200 in dW2 of timestep_mlp at 256 / 5376 wide), which no CPU result shows: the stray columns are
    never stored. So the launches are checked, at widths the tiles divide."""
    seen = _record_launches(monkeypatch)
    if op == "timestep_mlp":
        from h3bench.kernels import timestep_mlp_kernel as TM

        params = TimestepMLPParams(freq_dim=64, hidden=128, temb_dim=64)
        inputs = MLP.make_inputs(params, 40, 3, device)
        dy = MLP.make_grad_outs(params, 40, 103, device)[0]
        monkeypatch.setattr(TM, "configs", lambda: TM.DEFAULT)
        run_op(timestep_mlp, MLP_NAMES, inputs, dy)
    else:
        from h3bench.kernels import adaln_projection_kernel as AP

        # the pointer kernel's loads, with the GPU's tiles (the default's dW reads through TMA descriptors
        # on the GPU, which bound every load themselves: tests/test_kernel_gemm_tma.py)
        pointer = AP.ProjectionConfigs.uniform(*(dataclasses.replace(cfg, tma=False, tma_store=False)
                                                 for cfg in AP.DEFAULT.at(1)))
        monkeypatch.setattr(AP, "configs", lambda: pointer)
        params = AdaLNProjectionParams(hidden=16, temb_dim=64, chunks=6, modalities=1)
        inputs = ADA.make_inputs(params, 40, 3, device)
        dy = ADA.make_grad_outs(params, 40, 103, device)[0]
        run_op(adaln_projection, ADA_NAMES, inputs, dy)
    assert seen, "no GEMM launch recorded"
    for launch in seen:
        reach = -(-launch["N"] // launch["BLOCK_N"]) * launch["BLOCK_N"]
        assert launch["MASK_N"] or reach <= launch["n_load"], launch
    # adaln_projection's dW carries the db column (timestep_mlp's bias gradients are column sums)
    assert (op == "timestep_mlp") != any(launch["N"] > launch["n_main"] for launch in seen), "the db column"


def test_column_mask_needed():
    assert not gemm.column_mask_needed(256, 256, 64)
    assert gemm.column_mask_needed(257, 256, 64)     # the db column: one more tile
    assert gemm.column_mask_needed(100, 100, 64)
    assert not gemm.column_mask_needed(5377, 5392, 16) and gemm.column_mask_needed(5377, 5392, 64)


# --- argument errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,error,match", [
    (lambda t: {"x": t["x"].double()}, TypeError, "x has dtype"),
    (lambda t: {"w2": t["w2"].bfloat16()}, TypeError, "w2 has dtype"),
    (lambda t: {"x": t["x"][:, :-1]}, ValueError, "w1 must be"),
    (lambda t: {"x": t["x"][0]}, ValueError, r"x must be \[T, freq_dim\]"),
    (lambda t: {"b1": t["b1"][:-1]}, ValueError, "b1 must have shape"),
    (lambda t: {"w2": t["w2"][:, :-1]}, ValueError, "w2 must be"),
    (lambda t: {"b2": t["b2"][:-1]}, ValueError, "b2 must have shape"),
    (lambda t: {"b1": t["b1"].to("meta")}, ValueError, "b1 is on meta"),
    (lambda t: {"w1": t["w1"].tolist()}, TypeError, "w1 must be a torch.Tensor"),
])
def test_timestep_mlp_bad_input_names_the_argument(device, change, error, match):
    inputs, _ = mlp_case(device, 5)
    args = {**inputs.tensors}
    from h3bench.kernels import timestep_mlp_api as TM
    assert TM._fast_ok(*(inputs.tensors[n] for n in MLP_NAMES))   # the good call takes the cheap check
    args.update(change(args))
    assert not TM._fast_ok(*(args[n] for n in MLP_NAMES))   # a bad one never does: `_check` names it
    with pytest.raises(error, match=match):
        timestep_mlp(*(args[n] for n in MLP_NAMES))


@pytest.mark.parametrize("change,error,match", [
    (lambda t: {"temb": t["temb"].double()}, TypeError, "temb has dtype"),
    (lambda t: {"w": t["w"].float()}, TypeError, "w has dtype"),
    (lambda t: {"b": t["b"].float()}, TypeError, "b has dtype"),
    (lambda t: {"temb": t["temb"][:, :-1]}, ValueError, "w must be"),
    (lambda t: {"temb": t["temb"][0]}, ValueError, r"temb must be \[T, temb_dim\]"),
    (lambda t: {"b": t["b"][:-1]}, ValueError, "b must have shape"),
    (lambda t: {"w": t["w"].to("meta")}, ValueError, "w is on meta"),
    (lambda t: {"b": 3.0}, TypeError, "b must be a torch.Tensor"),
])
def test_adaln_projection_bad_input_names_the_argument(device, change, error, match):
    inputs, _ = ada_case(device, 5)
    args = {**inputs.tensors}
    args.update(change(args))
    with pytest.raises(error, match=match):
        adaln_projection(*(args[n] for n in ADA_NAMES))


# --- through the runner -----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_quick_plan_with_our_row(device, op):
    import importlib

    adapter = importlib.import_module(f"h3bench.adapters.{op}.h3bench_triton").ADAPTER
    run_quick_plan(op, adapter, device)  # batch-invariant, weight gradients repeatable


# --- GEMM2 swapped at small T (swap_ab) ------------------------------------------------------------------

SWAP = gemm.LaunchConfig(32, 16, 32, num_warps=4, num_stages=3, split_k=3, precision="fp16x3", local_scales=True,
                         swap_ab=True)


@pytest.mark.parametrize("rows", [1, 5, 16, 21])
def test_swapped_forward_gives_the_unswapped_bits(device, rows):
    """out^T = W a^T with the same steps, products and sums as the unswapped tile (bias added per row of
    C^T, the two small products and the scale-backs in the unswapped order): the same bits at every T,
    rows of the batch alone too, and within fp32's bound of float64. Under the interpreter the dots are
    fixed-order FMA chains; on the GPU this is the tensor core's claim (measured bitwise on the H200 at the
    op's size; `python -m tools.bench_gemm` rechecks rows alone against T = 2048)."""
    unswapped = dataclasses.replace(SWAP, block_m=16, block_n=32, swap_ab=False)
    g = torch.Generator().manual_seed(rows)
    a = (torch.randn(rows, 300, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, 300), generator=g))).to(device)
    w = (torch.randn(70, 300, generator=g) / 40).to(device)
    b = torch.randn(70, generator=g).to(device)
    y, _ = gemm.forward(a, w, b, SWAP, out_dtype=torch.float32)
    ref, _ = gemm.forward(a, w, b, unswapped, out_dtype=torch.float32)
    assert y.shape == (rows, 70) and y.is_contiguous()
    assert torch.equal(as_bits(y), as_bits(ref))
    assert rel_err(y, a.double() @ w.double().T + b.double()) <= FP32_TOL
    alone, _ = gemm.forward(a[-1:], w, b, SWAP, out_dtype=torch.float32)
    assert torch.equal(as_bits(alone[0]), as_bits(y[-1]))
    plain, _ = gemm.forward(a, w, None, SWAP, out_dtype=torch.float32)   # no bias: the same sums, bias-free
    assert rel_err(plain, a.double() @ w.double().T) <= FP32_TOL


def test_swap_ab_is_a_forward_option_of_local_fp16x3_only(device):
    with pytest.raises(ValueError, match="swap_ab"):
        gemm.LaunchConfig(64, 16, 32, precision="fp16x3", swap_ab=True)   # row maxima: not the order it mirrors
    with pytest.raises(ValueError, match="swap_ab"):
        gemm.LaunchConfig(64, 16, 32, swap_ab=True)
    with pytest.raises(ValueError, match="persistent"):
        gemm.LaunchConfig(64, 16, 32, precision="fp16x3", local_scales=True, swap_ab=True, persistent=True)
    a, w = torch.randn(3, 64).to(device), torch.randn(40, 64).to(device)
    with pytest.raises(ValueError, match="silu"):
        gemm.forward(a, w, None, SWAP, out_dtype=torch.float32, out_silu=True)
    with pytest.raises(ValueError, match="forward option"):
        gemm.input_grad(torch.randn(3, 40).to(device), w, SWAP)
    with pytest.raises(ValueError, match="forward option"):
        gemm.weight_grad(torch.randn(3, 40).to(device), a, SWAP, dw_dtype=torch.float32, db_dtype=None)


def test_fwd2_tiers_may_differ_only_outside_the_order():
    """fp16x3 local-scale tiers of GEMM2 may change tiles, warps, stages and swap_ab with T (each output is
    the same fp32 expression of its steps), never the step (block_k), the split or the precision."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    base = TM.DEFAULT
    big = base.fwd2[-1][1]
    dataclasses.replace(base, fwd2=((16, dataclasses.replace(SWAP, split_k=big.split_k)), (1 << 62, big)))
    for change, error in (({"block_k": 64, "split_k": big.split_k}, "one config for every row count"),
                          ({"split_k": 4}, "fwd2's split_k")):
        with pytest.raises(ValueError, match=error):
            dataclasses.replace(base, fwd2=((16, dataclasses.replace(SWAP, **change)), (1 << 62, big)))
    unscaled = dataclasses.replace(big, local_scales=False)
    with pytest.raises(ValueError, match="one config for every row count"):
        dataclasses.replace(base, fwd2=((16, dataclasses.replace(unscaled, block_m=128)), (1 << 62, unscaled)))
    assert TM.DEFAULT.fwd2[0][1].swap_ab and not TM.DEFAULT.fwd2[-1][1].swap_ab


def test_swapped_default_no_grad_and_autograd_agree(device, monkeypatch):
    """The default's GEMM2 tiers through the op: the no-grad recipe (swapped plan, operands passed the other
    way round) and the autograd path give the same bits at T = 3 (swapped, paired) and T = 20 (the unswapped
    tile), both within fp32's bound; the first 3 rows alone equal them within T = 20's batch."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    monkeypatch.setattr(TM, "configs", lambda: TM.DEFAULT)
    inputs, dy = mlp_case(device, 20)
    x = inputs.tensors["x"]
    rest = [inputs.tensors[n] for n in MLP_NAMES[1:]]
    with torch.no_grad():
        y20 = timestep_mlp(x, *rest)
        y3 = timestep_mlp(x[:3].clone(), *rest)
    assert torch.equal(as_bits(y3), as_bits(y20[:3]))
    y_grad, _ = run_op(timestep_mlp, MLP_NAMES, inputs, dy)
    assert torch.equal(as_bits(y_grad), as_bits(y20))
    ref = MLP.reference(MLP_PARAMS, inputs, (dy,), MLP_NAMES, MLP.name)
    assert rel_err(y20, ref.outputs[0]) <= FP32_TOL


def assert_same_forward_bits(device, ref_cfg, cfg, k, seed):
    """`cfg`'s forward (and its no-grad recipe's launch) gives `ref_cfg`'s bits on scaled random operands,
    1 and 21 rows, W [70, k]."""
    g = torch.Generator().manual_seed(seed)
    for rows in (1, 21):
        a = (torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, k), generator=g))).to(device)
        w = (torch.randn(70, k, generator=g) / 40 * torch.exp2(torch.randint(-6, 7, (70, k), generator=g))).to(device)
        b = torch.randn(70, generator=g).to(device)
        ref, _ = gemm.forward(a, w, b, ref_cfg, out_dtype=torch.float32)
        y, _ = gemm.forward(a, w, b, cfg, out_dtype=torch.float32)
        assert torch.equal(as_bits(y), as_bits(ref)), rows
        plan = gemm.forward_plan(rows, a.stride(), w, b, cfg)   # the no-grad recipe's launch
        y2 = torch.empty_like(y)
        gemm.run_forward_plan(plan, a, w, y2, bias=b)
        assert torch.equal(as_bits(y2), as_bits(ref)), rows


# --- two steps an iteration (pair_steps) -----------------------------------------------------------------

@pytest.mark.parametrize("swap", [False, True], ids=["b_is_w", "a_is_w"])
@pytest.mark.parametrize("k, split", [(384, 3), (256, 1), (300, 3), (320, 1)])
def test_pair_steps_give_one_step_an_iterations_bits(device, swap, k, split):
    """Two local-scale steps an iteration, both split before their products: the same bits as one step an
    iteration, swapped or not, split K or not; with a K tail (300) or an odd number of steps in a chunk
    the launch takes one step an iteration (`_plan`), the same bits again."""
    tile = {"block_m": 32, "block_n": 16, "swap_ab": True} if swap else {"block_m": 16, "block_n": 32}
    local = gemm.LaunchConfig(block_k=32, num_warps=4, num_stages=3, split_k=split, precision="fp16x3",
                              local_scales=True, **tile)
    assert_same_forward_bits(device, local, dataclasses.replace(local, pair_steps=True), k, seed=k + split)


def test_pair_steps_are_taken_only_where_every_chunk_has_an_even_step_count():
    cfg = gemm.LaunchConfig(16, 32, 32, split_k=3, precision="fp16x3", local_scales=True, pair_steps=True)
    def paired(K):
        return gemm._plan(None, (K, 1), (1, K), (70, 1), (0, 0), (0, 0), 5, 70, K, cfg, 70, 70, True,
                          (False,) * 9, 0, 0, 0).meta["PAIR"]
    assert paired(384)        # chunks of 128: 4 steps each
    assert not paired(300)    # a K tail
    assert not paired(32 * 9)  # chunks of 128 and a last one of 32: one step
    with pytest.raises(ValueError, match="pair_steps"):
        gemm.LaunchConfig(16, 32, 32, precision="fp16x3", pair_steps=True)

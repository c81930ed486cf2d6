"""kernels/gemm.py's tma configs (`LaunchConfig.tma`: A and B read through TMA descriptors made in the kernel,
`_gemm_tma_kernel`). Under the interpreter the descriptors' loads, bounds and zero fill are emulated and the
dots are numpy's, so these tests check the plumbing: the same tiles, K chunks, masks and epilogues as the
pointer kernel, bit for bit, and every operand a descriptor cannot read sent to the pointer kernel. That the
tensor core sums a TMA-fed step as a pointer-fed one is the GPU's to show (the last test, and
tools/bench_gemm.py's `bitwise_equal_default` at the model's size)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.kernels import adaln_projection_kernel as AP
from h3bench.kernels import gemm
from h3bench.kernels.gemm import LaunchConfig
from tests.helpers import shifted
from tests.test_kernel_gemm import ADA, ADA_NAMES, run_op

BF16 = torch.bfloat16
TILE = dict(block_m=32, block_n=64, block_k=32)   # the interpreter's tiles: rows and columns both masked below


def launched_kernels(monkeypatch) -> list:
    seen = []
    real = gemm.launch_keyed

    def spy(kernel, grid, device, key, args, meta):
        seen.append(kernel)
        real(kernel, grid, device, key, args, meta)
    monkeypatch.setattr(gemm, "launch_keyed", spy)
    return seen


def operands(device, dtype=BF16, rows=37, k=96, n=80):
    """temb [rows, k] fp32, a = bf16(silu(temb)) with its stored ones column, w [n, k], b [n], dy [rows, n]:
    rows and n not multiples of the tiles, every row stride a multiple of 16 bytes (TMA can read them)."""
    g = torch.Generator().manual_seed(11)
    temb = torch.randn(rows, k, generator=g).to(device)
    w = torch.randn(n, k, generator=g).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device)
    dy = torch.randn(rows, n, generator=g).to(dtype).to(device)
    a = gemm.silu_cast(temb, dtype, ones_column=True) if dtype != torch.float32 else torch.sigmoid(temb) * temb
    return temb, a, w, b, dy


def assert_bits(got, want, what):
    for g_, w_ in zip(got, want):
        assert torch.equal(as_bits(g_), as_bits(w_)), what


@pytest.mark.parametrize("tma_store", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_tma_forward_and_weight_grad_give_the_pointer_bits(device, monkeypatch, persistent, tma_store):
    """Forward (bias; bf16 and fp32 out), dW with the stored db column; with `tma_store` C goes out through a
    descriptor in two column halves (its bounds the stores' mask: 37 rows, 80 columns of 64-wide tiles)."""
    temb, a, w, b, dy = operands(device)
    pointer = LaunchConfig(**TILE, persistent=persistent)
    tma = dataclasses.replace(pointer, tma=True, tma_store=tma_store)

    def run(cfg):
        return (gemm.forward(a, w, b, cfg, out_dtype=BF16)[0], gemm.forward(a, w, b, cfg, out_dtype=torch.float32)[0],
                *gemm.weight_grad(dy, a, cfg, a_ones="stored", dw_dtype=BF16, db_dtype=BF16))
    want = run(pointer)
    seen = launched_kernels(monkeypatch)
    got = run(tma)
    assert seen == [gemm._gemm_tma_kernel] * 3
    assert_bits(got, want, tma.short())


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("split", [1, 2, 3])
def test_tma_input_grad_gives_the_pointer_bits(device, monkeypatch, persistent, split):
    """dtemb's GEMM: K chunks (each a whole number of steps, the last one short and ending past K, where the
    descriptor reads zeros), the last chunk's program adding them in chunk order, silu' in the epilogue;
    persistent programs walk (tile, chunk) items."""
    temb, a, w, b, dy = operands(device, k=96, n=400)   # K = 400: chunks of 256 (KALIGN) at split 2, 3 (one empty)
    pointer = LaunchConfig(**TILE, split_k=split)
    tma = dataclasses.replace(pointer, tma=True, persistent=persistent)
    want = gemm.input_grad(dy, w, pointer, dsilu_of=temb)
    seen = launched_kernels(monkeypatch)
    got = gemm.input_grad(dy, w, tma, dsilu_of=temb)
    assert seen == [gemm._gemm_tma_kernel]
    assert torch.equal(as_bits(got), as_bits(want))
    s = torch.sigmoid(temb.double())
    expect = (dy.double() @ w.double()) * (s * (1 + temb.double() * (1 - s)))
    assert (got.double() - expect).abs().max() <= 1e-5 * expect.abs().max()


def test_split_counters_are_left_zeroed_by_a_tma_launch(device):
    temb, a, w, b, dy = operands(device, n=400)
    cfg = LaunchConfig(**TILE, split_k=3, tma=True, persistent=True)
    first = gemm.input_grad(dy, w, cfg, dsilu_of=temb)
    assert int(gemm.split_counters(dy.device, 1).abs().sum()) == 0
    assert torch.equal(as_bits(gemm.input_grad(dy, w, cfg, dsilu_of=temb)), as_bits(first))


@pytest.mark.parametrize("case", ["misaligned base", "row stride not 16 bytes", "fp32 operands", "virtual ones"])
def test_operands_tma_cannot_read_take_the_pointer_kernel(device, monkeypatch, case):
    """The same config through the pointer kernel, the same bits, for operands a descriptor cannot take."""
    temb, a, w, b, dy = operands(device, dtype=torch.float32 if case == "fp32 operands" else BF16)
    if case == "misaligned base":
        w = shifted(w)
        assert w.data_ptr() % 16
    elif case == "row stride not 16 bytes":
        wide = torch.zeros(w.shape[0], w.shape[1] + 4, dtype=w.dtype, device=w.device)
        wide[:, :w.shape[1]] = w
        w = wide[:, :w.shape[1]]   # row stride 100 elements: 200 bytes
    pointer = LaunchConfig(**TILE)
    tma = dataclasses.replace(pointer, tma=True)
    if case == "virtual ones":
        a = a.contiguous()   # no stored ones column: the kernel makes it, which a descriptor load cannot

        def run(cfg):
            return gemm.weight_grad(dy, a, cfg, a_ones="virtual", dw_dtype=BF16, db_dtype=BF16)
    else:
        def run(cfg):
            return gemm.forward(a, w, b, cfg, out_dtype=torch.float32)[0], gemm.input_grad(dy, w, cfg, dsilu_of=temb)
    want = run(pointer)
    seen = launched_kernels(monkeypatch)
    got = run(tma)
    assert seen and all(k is gemm._gemm_kernel for k in seen), case
    assert_bits(got, want, case)


def test_tma_configs_are_checked():
    with pytest.raises(ValueError, match="tma is a 16-bit"):
        LaunchConfig(**TILE, tma=True, precision="tf32x3")
    with pytest.raises(ValueError, match="tma is a 16-bit"):
        LaunchConfig(**TILE, tma=True, k_major=True)
    with pytest.raises(ValueError, match="tma_store is a tma option"):
        LaunchConfig(**TILE, tma_store=True)
    with pytest.raises(ValueError, match="tma_store is a tma option"):
        LaunchConfig(**TILE, tma=True, tma_store=True, split_k=2)
    with pytest.raises(ValueError, match="16 to 256"):
        LaunchConfig(8, 64, 32, tma=True)
    with pytest.raises(ValueError, match="persistent config takes no split-K"):
        LaunchConfig(**TILE, split_k=2, persistent=True)
    assert LaunchConfig(**TILE, split_k=2, persistent=True, tma=True).short() == "32x64x32/w4/s3/k2/P/TMA"
    for name in ("fwd", "dx", "dw"):   # one tile, step and chunking for every T
        assert len({AP._order(cfg) for _, cfg in getattr(AP.DEFAULT, name)}) == 1, name
    assert any(cfg.tma for _, cfg in AP.DEFAULT.fwd) and not AP.DEFAULT.fwd[0][1].tma   # the T switch
    assert AP.DEFAULT.at(AP.TMA_FROM - 1).dx.tma is False and AP.DEFAULT.at(AP.TMA_FROM).dx.tma


def _tiers(**by_name):
    return AP.ProjectionConfigs(**{name: by_name.get(name, ((AP.BIG, LaunchConfig(**TILE)),))
                                   for name in ("fwd", "dx", "dw")})


def test_projection_tiers_may_differ_only_in_how_tiles_are_fetched():
    """A GEMM's tiers may change TMA or pointers, persistence, stages and grouping with T (the same tiles, k
    steps and chunks: the same bits), nothing else; tiers ascend and end with every T."""
    base = LaunchConfig(**TILE)
    how = dataclasses.replace(base, tma=True, tma_store=True, persistent=True, num_stages=4, group_m=16)
    _tiers(fwd=((7, base), (AP.BIG, how)))
    for other in (dataclasses.replace(base, block_n=128), dataclasses.replace(base, block_k=64),
                  dataclasses.replace(base, num_warps=8)):
        with pytest.raises(ValueError, match="tiers may differ only in tma, tma_store, persistent"):
            _tiers(dw=((7, base), (AP.BIG, other)))
    with pytest.raises(ValueError, match="tiers may differ only"):
        _tiers(dx=((7, dataclasses.replace(base, split_k=6)), (AP.BIG, dataclasses.replace(base, split_k=3))))
    for bad in (((7, base),), ((AP.BIG, base), (7, base)), ()):
        with pytest.raises(ValueError, match="tiers must ascend and end with BIG"):
            _tiers(fwd=bad)
    with pytest.raises(ValueError, match="take no split-K"):
        _tiers(dw=((AP.BIG, dataclasses.replace(base, split_k=2)),))


def test_tma_projection_configs_give_the_default_bits(device, monkeypatch):
    """The op at T = 1 and 37 with widths a descriptor can read (temb 64, table 96: 16-byte rows): AP.DEFAULT's
    outputs and gradients bitwise those of its tiles through pointers alone, its GEMMs launched through the
    tma kernel where their tier says (dW at every T, the forward and dx from TMA_FROM rows; also with the
    switch moved to 2 rows, so that T = 37 takes the TMA tiers). On the GPU that is the tensor core's claim;
    on the CPU the interpreter runs the GPU's config set (its 128 x 256 tiles), which it otherwise swaps
    for INTERPRETER's."""
    from h3bench.harness.ops.adaln_projection import AdaLNProjectionParams
    from h3bench.kernels.adaln_projection_api import adaln_projection

    if device.type != "cuda":
        monkeypatch.setattr(AP, "interpreter_active", lambda: False)
    switched_at_2 = AP.ProjectionConfigs(**{name: tuple((1 if limit < AP.BIG else limit, cfg)
                                                        for limit, cfg in getattr(AP.DEFAULT, name))
                                            for name in ("fwd", "dx", "dw")})
    pointer = AP.ProjectionConfigs.uniform(*(dataclasses.replace(cfg, tma=False, tma_store=False)
                                             for cfg in AP.DEFAULT.at(1)))
    params = AdaLNProjectionParams(hidden=16, temb_dim=64, chunks=6, modalities=1)
    for rows in (1, 37):
        inputs = ADA.make_inputs(params, rows, 3, device)
        dy = ADA.make_grad_outs(params, rows, 103, device)[0]
        results = []
        for configs, tma_launches in ((pointer, 0), (AP.DEFAULT, 1), (switched_at_2, 1 if rows == 1 else 3)):
            monkeypatch.setattr(AP, "_CONFIGS", [configs])
            seen = launched_kernels(monkeypatch)
            results.append(run_op(adaln_projection, ADA_NAMES, inputs, dy))
            assert seen.count(gemm._gemm_tma_kernel) == tma_launches, (rows, seen)
        (y0, g0), *others = results
        for y1, g1 in others:
            assert torch.equal(as_bits(y1), as_bits(y0)), rows
            for name in ADA_NAMES:
                assert torch.equal(as_bits(g1[name]), as_bits(g0[name])), (rows, name)


def test_tma_scratch_allocator_is_torch_unless_the_caller_set_one(monkeypatch):
    """Descriptors made in the kernel need triton's allocator at launch: `tma_scratch_allocator` sets torch's
    where none is set and leaves a caller's own alone (each case in a fresh context: the allocator is a
    context variable)."""
    import contextvars

    import triton
    from triton.runtime import _allocation

    monkeypatch.setattr(gemm, "INTERPRETED", False)   # the interpreter needs none, so the call returns at once there

    def after(initial):
        def run():
            if initial is not None:
                triton.set_allocator(initial)
            gemm.tma_scratch_allocator()
            return _allocation._allocator.get()
        return contextvars.Context().run(run)  # empty: every context variable at its default

    outside = _allocation._allocator.get()  # on a GPU earlier tma launches of this process may have set it
    assert after(None) is gemm._torch_scratch

    def mine(size, alignment, stream):
        return None
    assert after(mine) is mine
    assert _allocation._allocator.get() is outside   # this context untouched

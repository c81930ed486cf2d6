"""The GPU probes' own logic on the CPU: tools/bitwise_probe.py's data sets and verdicts (with plain torch
launches standing in for a kernel's), and tools/probe_stream.py's tile-major walk (the interpreter)."""
import pytest
import torch

from h3bench.kernels.common import INTERPRETED
from tools import bitwise_probe as BP


def _operands(rows=12, k=16, n=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def test_data_sets_are_the_four_described_and_repeat_by_seed():
    a, w, b = _operands()
    sets = BP.data_sets(a, w, b, seed=5, spread=12, row_spread=40, tiny=2.0 ** -120)
    assert list(sets) == ["model", "spread", "rows", "cancel"]
    ratio = sets["spread"][0] / a
    assert torch.equal(torch.exp2(torch.log2(ratio.abs()).round()), ratio.abs())   # powers of two
    assert ratio.abs().max() > 2.0 ** 4   # spread out, not all near 1
    ra = sets["rows"][0]
    assert torch.all(ra[1] == 0) and torch.equal(ra[2], a[2] * 2.0 ** -120)
    row_ratio = ra[3] / a[3]
    assert torch.all(row_ratio == row_ratio[0])   # one scale a row
    c = sets["cancel"][0]
    half = a.shape[1] // 2
    assert torch.allclose(c[:, :half] + c[:, half:], torch.zeros_like(c[:, :half]), atol=1e-5)
    again = BP.data_sets(a, w, b, seed=5, spread=12, row_spread=40, tiny=2.0 ** -120)
    assert all(torch.equal(x, y) for k in sets for x, y in zip(sets[k], again[k]))


def test_check_tells_an_equal_candidate_from_a_different_one_and_keeps_errors():
    a, w, b = _operands()

    def run(cfg, a, w, b):
        y = b.expand(a.shape[0], -1).clone()
        for k in range(a.shape[1]):   # elementwise steps in k order: each row's bits its own (a CPU matmul's are not)
            y = y + a[:, k:k + 1] * w[:, k]
        if cfg == "broken":
            raise RuntimeError("does not compile")
        if cfg == "off":   # a different order: the last bit of one output element
            y = y.clone()
            y[0, 0] = torch.nextafter(y[0, 0], torch.tensor(float("inf")))
        if cfg == "batch":   # depends on the batch: only a whole batch differs
            y = y + (a.shape[0] > 8) * 1e-3
        return (y, None)

    sets = BP.data_sets(a, w, b, seed=1, spread=4, row_spread=4, tiny=2.0 ** -10)
    records = BP.check(sets, run, "default", {"same": "same", "off": "off", "broken": "broken"}, [1, 3])
    assert len(records) == 8
    for r in records:
        assert r["default_alone_equals_big"] and r["same"]["equal_default"] and r["same"]["equal_big"]
        assert not r["off"]["equal_default"] and r["off"]["differing"] == 1
        assert "does not compile" in r["broken"]["error"]
    assert not BP.all_equal(records)
    assert BP.all_equal([{k: v for k, v in r.items() if k != "off"} for r in records])
    # the control: a default whose rows depend on the batch is caught by the alone-vs-batch comparison
    control = BP.check(sets, run, "batch", {"same": "batch"}, [1])
    assert not any(r["default_alone_equals_big"] for r in control)
    assert not BP.all_equal(control)


@pytest.mark.skipif(not INTERPRETED,
                    reason="checks the probe's index walk on CPU tensors under the interpreter; on a GPU the probe "
                           "itself runs (tools/probe_stream.py)")
def test_probe_stream_walks_the_same_elements_row_major_and_tile_major():
    import tools.probe_stream as P
    n, k = 128, 384   # 12 steps of 32: two a chunk
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3))
    sums = {}
    for name in ("fp16x2_row_r64_k32_s4", "fp16x2_tile_r64_k32_s4", "fp16x2_tile_r16_k32_s4_w1"):
        out = torch.empty(P.SPLIT * n)
        call = P.launcher(w, P.variants()[name], out=out)
        call()
        sums[name] = out.view(P.SPLIT, n).sum(0)
    first = sums["fp16x2_row_r64_k32_s4"]
    assert all(torch.allclose(v, first, rtol=1e-5, atol=1e-3) for v in sums.values())
    assert torch.allclose(first, 0.5 * 16 * w.sum(1), rtol=1e-3, atol=1e-2)   # each element x 16 columns x 0.5


def test_a_probe_without_a_gpu_says_so():
    import pytest
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    from tools import probe_fwd1, probe_swap_ab
    for probe in (probe_fwd1, probe_swap_ab):
        with pytest.raises(SystemExit, match="needs a GPU"):
            probe.main(["--rows", "1"])


def test_bench_gemm_table_shows_a_failed_candidate_list_and_the_others():
    """tools/bench_gemm.py keeps a section's exception as {"error", "trace"} (`guard`); the table printed at
    the end of a GPU call names it beside the lists that ran, instead of failing on it after the JSON."""
    from tools import bench_gemm
    row = {"kernel": "fwd", "config": "128x256x64/w4/s3/TMA/WS", "us": {"1": {"stream_us": [10.0, 9.0]}},
           "bitwise_equal_default": True, "default": False}
    text = bench_gemm.table({"copy_gbps": 4200.0, "variants": {},
                             "configs": {"adaln_projection": {"error": "RuntimeError: boom", "trace": "..."},
                                         "timestep_mlp": [row]}})
    assert "adaln_projection: ERROR RuntimeError: boom" in text
    assert "128x256x64/w4/s3/TMA/WS" in text and "T1:9.0" in text and "=default True" in text
    assert "== timestep_mlp (copy" not in text   # no op section ran (--skip-ops): no empty header for it

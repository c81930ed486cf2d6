"""Where the bits differ and how far: ULP distances in the tensor's own dtype, the first differing row and
element, parameter gradients that do not repeat; recorded by the probes beside the counts and rendered."""
from __future__ import annotations

import pytest
import torch

from h3bench.harness.probes.difference import NAN_ULP, first_difference, param_difference, ulp_distance
from h3bench.harness.runner import run
from tests.helpers import composition, even
from tests.test_blame import request


def next_up(t: torch.Tensor, steps: int = 1) -> torch.Tensor:
    """`steps` representable values above each positive element (its bit pattern plus steps)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return (t.view(ints) + steps).view(t.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_ulp_distance_counts_representable_values(dtype):
    a = torch.tensor([1.0, 3.0, 1e-3, 7.5], dtype=dtype)
    assert ulp_distance(a, next_up(a)).tolist() == [1, 1, 1, 1]
    assert ulp_distance(next_up(a, 5), a).tolist() == [5] * 4
    assert ulp_distance(-a, -next_up(a, 2)).tolist() == [2] * 4


def test_ulp_distance_edge_cases():
    zero, nan = torch.tensor([0.0]), torch.tensor([float("nan")])
    assert ulp_distance(zero, -zero).tolist() == [0]
    tiny = torch.tensor([1e-45])  # the smallest float32 subnormal: -tiny and +tiny are 2 apart
    assert ulp_distance(-tiny, tiny).tolist() == [2]
    assert ulp_distance(nan, zero).tolist() == [NAN_ULP] and ulp_distance(nan, nan).tolist() == [0]


def test_first_difference_names_the_tensor_row_and_element():
    a = torch.randn(6, 10, dtype=torch.bfloat16)
    b = a.clone()
    b[4, 7] = next_up(b[4, 7].clone(), 3)
    b[5, 0] = next_up(b[5, 0].clone(), 1)
    same = a.clone()
    d = first_difference([("y", same, a), ("grad x", b, a)], seed=3, batch=40, positions=range(10, 16),
                         rows=range(100, 106))
    assert (d.tensor, d.row, d.position, d.element, d.batch, d.seed, d.max_ulp) == ("grad x", 104, 14, 7, 40, 3, 3)
    assert d.max_abs == pytest.approx((b.double() - a.double()).abs().max().item())
    assert first_difference([("y", a, a.clone())], seed=3, batch=6, positions=range(6), rows=range(6)) is None


def test_param_difference():
    w = torch.rand(64) + 0.5
    moved = w.clone()
    moved[:3] = next_up(moved[:3].clone(), 2)
    d = param_difference("w", moved, w)
    assert (d.param, d.elements, d.numel, d.max_ulp) == ("w", 3, 64, 2)
    assert param_difference("w", w, w.clone()) is None


class _Jitter(torch.autograd.Function):
    """Identity whose backward moves w's gradient by one ULP on every other call: not repeatable."""
    calls = {"n": 0}

    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        _Jitter.calls["n"] += 1
        return next_up(grad.contiguous().clone()) if _Jitter.calls["n"] % 2 else grad


def jittery_w(x, w, sh, sc, idx):
    return composition(x, _Jitter.apply(w), sh, sc, idx)


def planted_on_even(x, w, sh, sc, idx):
    y = composition(x, w, sh, sc, idx)
    return y * (1 + 2 ** -7) if even(x) else y


def honest(x, w, sh, sc, idx):
    return composition(x, w, sh, sc, idx)


def test_the_probes_record_where_and_how_far():
    rows = run(request(planted_on_even, jittery_w, honest)).results["plain"]
    bi = rows["planted_on_even"].batch_invariance
    located = [c.first_difference for c in bi.all_rows.values() if c.fwd_differ]
    assert located and all(d is not None and d.tensor == "y" and d.max_ulp >= 1 for d in located)
    assert bi.full_vs_sub_batches.first_difference.tensor == "y"
    assert all(f.difference is not None and f.difference.batch == f.batch and f.difference.row == f.row
               for f in bi.batch_size_sweep.first_failures)
    jitter = rows["jittery_w"].batch_invariance
    assert jitter.params_repeatable is False
    assert [(p.param, p.max_ulp) for p in jitter.params_differences] == [("w", 1)]
    clean = rows["honest"].batch_invariance
    assert clean.params_differences is None and all(c.first_difference is None for c in clean.all_rows.values())


def test_the_reports_show_them(tmp_path):
    from h3bench.harness.schema import save
    from h3bench.reports.render import render_all
    evidence = run(request(planted_on_even, jittery_w, honest))
    path = tmp_path / "e.json"
    save(evidence, path)
    render_all(path)
    text = path.with_suffix(".md").read_text()
    assert "first: y row" in text and "ULP" in text
    assert "parameter gradients differ run to run: w " in text and "elements, up to 1 ULP" in text

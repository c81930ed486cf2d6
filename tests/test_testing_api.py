"""h3bench.testing: batch invariance as a test assertion. An honest row-wise RMSNorm passes; each planted
fault (a reduction that splits from 256 rows, an odd-batch tail, a row-position dependency, parameter
gradients summed in a run-dependent order) fails the assertion with its check named and gives a record with
`.invariant` False and counts above zero; misuse is a one-line TypeError/ValueError, the function's own
failure an "unavailable: <reason>" record and assertion. All on CPU tensors, whatever the test device."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness.ops.from_examples import ExamplesOp, OutputSpec
from h3bench.testing import InvarianceCheck, assert_batch_invariant, check_batch_invariance
from tests.user_op_rows import ScaleWithGradInRunOrder

EPS = 1e-6
HALF = 32


def examples(rows: int = 8, width: int = 64, weight_grad: bool = True, x_grad: bool = True) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=gen).requires_grad_(x_grad)
    w = (1 + 0.1 * torch.randn(width, generator=gen)).requires_grad_(weight_grad)
    return {"x": x, "w": w}


def rms_norm(x, w):
    """Row-wise: each row's mean of squares, its reciprocal root, then x * r * w in that order."""
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
    return (x * r) * w


def split_from_256(x, w):
    """From 256 rows the mean of squares is summed in two halves of the columns."""
    if x.shape[0] < 256:
        return rms_norm(x, w)
    sq = x * x
    r = torch.rsqrt((sq[:, :HALF].sum(-1, keepdim=True) + sq[:, HALF:].sum(-1, keepdim=True)) / x.shape[1] + EPS)
    return (x * r) * w


def odd_batch_tail(x, w):
    """In an odd batch, the rows past the last even row multiply in another order: x * (r * w)."""
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
    y = (x * r) * w
    if x.shape[0] % 2:
        y = torch.cat([y[:-1], x[-1:] * (r[-1:] * w)])
    return y


def row_position(x, w):
    """Each row gains its index in the batch times a tiny step."""
    index = torch.arange(x.shape[0], dtype=x.dtype, device=x.device).unsqueeze(1)
    return rms_norm(x, w) + index * 1e-4


def atomic_weight_grad(x, w):
    """y = xhat * w with dw summed row by row in an order that changes with every backward, as atomics
    would add them; dxhat is exact per row."""
    return ScaleWithGradInRunOrder.apply(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS), w)


def _failing(fn, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        assert_batch_invariant(fn, examples(), per_row=["x"], **kwargs)
    return str(caught.value)


def test_an_honest_rms_norm_passes_with_its_gradients():
    given = examples()
    record = assert_batch_invariant(rms_norm, given, per_row=["x"])
    assert given["x"].grad is None and given["w"].grad is None  # the caller's tensors are left alone
    assert isinstance(record, InvarianceCheck) and record.invariant and record.failures == ()
    assert record.unavailable is None and record.first_differences == {} and record.param_differences == ()
    assert set(record.counts) == {"all_rows 3", "all_rows 32", "full_vs_sub_batches", "batch_size_sweep",
                                  "param_grads"}
    assert all(c.differ == 0 for c in record.counts.values())
    # the quick plan ran: 35 rows alone, 28 sub-batches of a 640-row batch, the sweep; w's gradient checked
    assert record.counts["full_vs_sub_batches"].compared == 28
    assert record.counts["param_grads"].compared == 1
    assert record.batch_invariance.batch_invariant


def test_the_record_is_frozen():
    record = check_batch_invariance(rms_norm, examples(), per_row=["x"], grads=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.invariant = False


def test_a_reduction_that_splits_from_256_rows_is_caught_by_the_sub_batches_and_the_sweep():
    message = _failing(split_from_256)
    assert "full_vs_sub" in message and "sweep" in message and "all_rows" not in message
    assert "out row" in message and "element" in message and "in a batch of" in message and "ULP" in message
    record = check_batch_invariance(split_from_256, examples(), per_row=["x"])
    assert not record.invariant
    assert record.counts["full_vs_sub_batches"].differ > 0 and record.counts["batch_size_sweep"].differ > 0
    assert record.counts["all_rows 32"].differ == 0
    first = record.first_differences["batch_size_sweep"]
    assert first.tensor in ("out", "grad x") and first.batch >= 256 and first.max_ulp > 0


def test_an_odd_batch_tail_is_caught_by_all_rows():
    message = _failing(odd_batch_tail, grads=False)
    assert "all_rows 3" in message and "out row" in message
    record = check_batch_invariance(odd_batch_tail, examples(), per_row=["x"], grads=False)
    assert not record.invariant and record.counts["all_rows 3"].fwd_differ > 0
    assert record.counts["all_rows 3"].rowgrad_differ == 0  # forward only: no row gradients compared


def test_a_row_position_dependency_is_caught_with_where_it_differs():
    message = _failing(row_position)
    assert "all_rows 3" in message and "full_vs_sub" in message and "sweep" in message
    record = check_batch_invariance(row_position, examples(), per_row=["x"])
    first = record.first_differences["all_rows 3"]
    assert (first.tensor, first.batch, first.row, first.position) == ("out", 3, 1, 1)
    assert first.max_ulp > 0


def test_parameter_gradients_in_a_run_dependent_order_are_caught():
    message = _failing(atomic_weight_grad)
    assert "parameter gradients not repeatable" in message and "w " in message
    record = check_batch_invariance(atomic_weight_grad, examples(), per_row=["x"])
    assert not record.invariant and record.counts["param_grads"].differ == 1
    assert record.param_differences[0].param == "w" and record.param_differences[0].elements > 0
    # rows and row gradients stay invariant: only the parameter check fails
    assert all(c.differ == 0 for k, c in record.counts.items() if k != "param_grads")


def test_forward_only_leaves_the_parameter_gradients_unchecked():
    record = assert_batch_invariant(atomic_weight_grad, examples(), per_row=["x"], grads=False)
    assert "param_grads" not in record.counts


def test_the_full_plan_has_the_rfc_token_counts():
    from tests.helpers import RFC_ALL_ROWS, RFC_COMPARISONS, RFC_SUB_BATCHES

    record = check_batch_invariance(lambda x: x * 2, {"x": torch.randn(4, 1)}, per_row=["x"], plan="full",
                                    grads=False)
    assert record.invariant and record.plan == "full"
    assert {k: c.compared for k, c in record.counts.items()} == {
        **{f"all_rows {n}": rows for n, rows in RFC_ALL_ROWS.items()},
        "full_vs_sub_batches": RFC_SUB_BATCHES["token"], "batch_size_sweep": RFC_COMPARISONS}


def test_on_the_test_device(device):
    """Elementwise and gathered, with a parameter gradient summed over rows: invariant on any device (its
    CUDA reductions are over the batch, deterministic run to run); the same with a row-position term is not."""
    gen = torch.Generator().manual_seed(2)
    given = {"x": torch.randn(6, 32, generator=gen).to(device).requires_grad_(),
             "w": torch.randn(32, generator=gen).to(device).requires_grad_(),
             "table": torch.randn(4, 32, generator=gen).to(device),
             "idx": torch.tensor([0, 3, 1, 2, 2, 0], device=device)}

    def scaled(x, w, table, idx):
        return (x * w) * table.index_select(0, idx)

    def positioned(x, w, table, idx):
        return scaled(x, w, table, idx) + torch.arange(x.shape[0], device=x.device).unsqueeze(1) * 1e-4

    record = assert_batch_invariant(scaled, given, per_row=["x", "idx"])
    assert torch.device(record.device).type == device.type and record.counts["param_grads"].compared == 1
    failed = check_batch_invariance(positioned, given, per_row=["x", "idx"])
    assert not failed.invariant and failed.counts["all_rows 3"].fwd_differ > 0


def test_index_inputs_keep_the_examples_range():
    table = torch.randn(5, 16)
    idx = torch.tensor([3, 4, 3])  # rows are drawn in [3, 4]: a table of 5 rows is indexed in range

    def gather_scale(x, table, idx):
        assert int(idx.min()) >= 3 and int(idx.max()) <= 4, "an index outside the examples' range"
        return x * table.index_select(0, idx)

    record = assert_batch_invariant(gather_scale, {"x": torch.randn(3, 16), "table": table, "idx": idx},
                                    per_row=["x", "idx"])
    assert record.invariant


def test_drawn_rows_look_like_the_examples():
    x = 5 + 0.5 * torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    op = ExamplesOp("f", {"x": x, "i": torch.tensor([[2]] * 64)}, ["x", "i"],
                    [OutputSpec("out", (32,), torch.float32)])
    drawn = op.make_inputs(None, 1000, seed=3, device=torch.device("cpu")).tensors
    assert drawn["x"].shape == (1000, 32) and drawn["x"].dtype == torch.float32
    assert abs(float(drawn["x"].mean()) - 5) < 0.05 and abs(float(drawn["x"].std()) - 0.5) < 0.05
    assert float(drawn["x"].min()) >= float(x.min()) and float(drawn["x"].max()) <= float(x.max())
    assert torch.equal(drawn["i"], torch.full((1000, 1), 2))
    again = op.make_inputs(None, 1000, seed=3, device=torch.device("cpu")).tensors
    assert torch.equal(again["x"], drawn["x"])  # seeded


def test_a_builtin_op_runs_its_own_inputs_plan_and_constants():
    from h3bench.harness.config import load_config
    from tests.helpers import composition

    seen = []

    def with_eps(x, w, sh, sc, idx, eps):
        seen.append(eps)
        return composition(x, w, sh, sc, idx)

    record = assert_batch_invariant(with_eps, op="norm_modulate", device="cpu")
    assert record.invariant and record.counts["full_vs_sub_batches"].compared == 28
    assert record.counts["param_grads"].compared == 3  # w, sh, sc
    assert set(seen) == {load_config("norm_modulate", quick=True).inputs.eps}
    message = _failing_op(lambda x, w, sh, sc, idx: composition(x, w, sh, sc, idx)
                          + torch.arange(x.shape[0]).unsqueeze(1).to(x.dtype))
    assert "all_rows 3" in message


def _failing_op(fn) -> str:
    with pytest.raises(AssertionError) as caught:
        assert_batch_invariant(fn, op="norm_modulate", device="cpu")
    return str(caught.value)


# --- the function's own failures: "unavailable: <reason>" --------------------------------------------------

def _unavailable(fn, **kwargs) -> str:
    record = check_batch_invariance(fn, examples(), per_row=["x"], **kwargs)
    assert not record.invariant and record.counts == {} and record.failures == (f"unavailable: {record.unavailable}",)
    with pytest.raises(AssertionError) as caught:
        assert_batch_invariant(fn, examples(), per_row=["x"], **kwargs)
    message = str(caught.value)
    assert "\n" not in message and "unavailable: " in message
    return message


def test_a_function_that_raises_is_unavailable():
    def broken(x, w):
        raise RuntimeError("no kernel for this shape")
    assert "RuntimeError: no kernel for this shape" in _unavailable(broken)


def test_a_function_that_raises_only_on_large_batches_names_the_check():
    def broken(x, w):
        if x.shape[0] > 100:
            raise RuntimeError("too many rows")
        return rms_norm(x, w)
    assert "too many rows (in full_vs_sub_batches)" in _unavailable(broken)


def test_a_non_tensor_result_is_unavailable():
    assert "fn returned dict" in _unavailable(lambda x, w: {"y": x})


def test_an_output_that_is_not_per_row_is_unavailable():
    assert "first dimension must be the rows" in _unavailable(lambda x, w: (x * w).sum(0))


def test_an_output_whose_shape_changes_with_the_batch_is_unavailable():
    assert "has shape (3, 63)" in _unavailable(lambda x, w: (x * w)[:, :63] if x.shape[0] == 3 else x * w)


def test_an_output_whose_dtype_changes_with_the_batch_is_unavailable():
    assert "dtype torch.float64" in _unavailable(lambda x, w: (x * w).double() if x.shape[0] > 8 else x * w)


def test_an_output_in_another_dtype_than_the_inputs_is_unavailable_from_the_first_call():
    """The contract is the first floating-point per-row input's dtype (as for a user op), not whatever the
    function's first call returned: a function that widens its output to float64 breaks it."""
    message = _unavailable(lambda x, w: (x * w).double())
    assert "output 'out' is torch.float64, the contract's dtype is torch.float32" in message
    assert "the first floating-point per-row input's, 'x'" in message


def test_bf16_inputs_with_a_float32_output_break_the_contract_unless_declared():
    x = examples()["x"].detach().to(torch.bfloat16).requires_grad_()
    w = examples()["w"]
    widening = lambda x, w: x.float() * w  # noqa: E731
    record = check_batch_invariance(widening, {"x": x, "w": w}, per_row=["x"])
    assert record.unavailable and "the contract's dtype is torch.bfloat16" in record.message()
    assert check_batch_invariance(widening, {"x": x, "w": w}, per_row=["x"], out_dtype=torch.float32).invariant


def test_an_integer_output_keeps_its_own_dtype():
    record = check_batch_invariance(lambda x, w: (rms_norm(x, w), x.argmax(-1)), examples(), per_row=["x"])
    assert record.invariant, record.message()


def test_an_output_on_another_device_is_unavailable():
    assert "is on meta" in _unavailable(lambda x, w: torch.empty(x.shape, device="meta"))


def test_gradients_that_are_not_produced_are_unavailable():
    assert "do not require grad" in _unavailable(lambda x, w: (x * w).detach())


# --- misuse: one line, TypeError or ValueError --------------------------------------------------------------

@pytest.mark.parametrize("call, error, words", [
    (lambda: check_batch_invariance(rms_norm), TypeError, "give example inputs"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["y"]), ValueError, "not among the examples"),
    (lambda: check_batch_invariance(rms_norm, examples()), ValueError, "per_row must name"),
    (lambda: check_batch_invariance(rms_norm, {"x": torch.ones(3, 4), "w": torch.ones(2, 4)}, per_row=["x", "w"]),
     ValueError, "share their first dimension"),
    (lambda: check_batch_invariance(rms_norm, {"x": torch.ones(3, 4), "w": 2.0}, per_row=["x"]),
     TypeError, "not a tensor"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["x"], plan="huge"), ValueError, "plan must be"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["x"], op="norm_modulate"), ValueError, "not both"),
    (lambda: check_batch_invariance(rms_norm, op="no_such_op"), ValueError, "unknown op"),
    (lambda: check_batch_invariance(None, examples(), per_row=["x"]), TypeError, "fn must be callable"),
    (lambda: check_batch_invariance(rms_norm, {"x": torch.ones(()), "w": torch.ones(4)}, per_row=["x"]),
     ValueError, "is a scalar"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["x"], device="meta"), ValueError,
     "the examples are on cpu"),
    (lambda: check_batch_invariance(rms_norm, op="norm_modulate", device="no_such_device"), ValueError,
     "is not a device"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["x"], out_dtype="float32"), TypeError,
     "out_dtype must be a torch.dtype"),
    (lambda: check_batch_invariance(rms_norm, examples(), per_row=["x"], out_dtype=(torch.float32,) * 2), TypeError,
     "one per output (1)"),
    (lambda: check_batch_invariance(rms_norm, op="norm_modulate", out_dtype=torch.float32), ValueError,
     "a built-in op's contract is its own"),
])
def test_misuse_is_one_line(call, error, words):
    with pytest.raises(error) as caught:
        call()
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_per_row_may_be_one_name():
    assert check_batch_invariance(rms_norm, examples(), per_row="x", grads=False).invariant

"""A second op with two per-row gradients and two outputs runs through the whole quick plan: the probes,
accuracy, latency, the schema and the reports need no change for it."""
from __future__ import annotations

import pytest
import torch

from h3bench.harness import ops, schema
from h3bench.harness.adapter import from_function
from h3bench.harness.config import load_config
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult
from tests.helpers import GradBumpOnEvenBatches, quick_config

CPU = torch.device("cpu")
TOY = "toy_two_outputs"
GRADS = ("a", "s", "b")
BUMP = 2 ** -5


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    ops.register(TOY, "tests.toy_op")
    yield
    ops.OP_MODULES.pop(TOY, None)


def honest(a, s, b, idx):
    from tests.toy_op import composition

    return composition(a, s, b, idx)


def second_output_on_even_batches(a, s, b, idx):
    mixed, product = honest(a, s, b, idx)
    return mixed, product + (product * BUMP).detach() if a.shape[0] % 2 == 0 else product


def b_gradient_on_even_batches(a, s, b, idx):
    return honest(a, s, GradBumpOnEvenBatches.apply(b, 1 + BUMP), idx)


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    config = quick_config(TOY)
    adapters = [from_function(fn, name=fn.__name__, op=TOY, differentiable=GRADS)
                for fn in (honest, second_output_on_even_batches, b_gradient_on_even_batches)]
    out = tmp_path_factory.mktemp("toy") / "toy.json"
    found = run(RunRequest(config=config, device=CPU, adapters=adapters, modes=["plain"], out=out,
                           measure_bandwidth=False))
    return found, out


def test_the_toy_config_layers_its_own_folder_over_the_quick_plans():
    config = load_config(TOY, quick=True)
    assert config.inputs.width == 6 and config.inputs.table_rows == 5  # quick.toml over default.toml
    assert config.plans == "quick" and config.full_vs_sub.full_batch == 640


def test_honest_toy_rows_pass_with_both_outputs_and_all_gradients(evidence):
    found, out = evidence
    row = found.results["plain"]["honest"]
    assert isinstance(row, RowResult) and row.batch_invariance.batch_invariant is True
    assert row.batch_invariance.params_repeatable is True
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err < 2 ** -7  # both outputs, one bf16 rounding each
        assert set(size.grad_rel_err) == set(GRADS) and max(size.grad_rel_err.values()) < 2 ** -7
        assert size.fwd_us > 0 and size.fwd_bwd_net_us > 0 and size.fwd_bwd_stream_us > 0
    assert schema.to_dict(schema.load(out)) == schema.to_dict(found)


def test_a_fault_in_the_second_output_is_a_forward_difference(evidence):
    bi = evidence[0].results["plain"]["second_output_on_even_batches"].batch_invariance
    assert bi.all_rows["32"].fwd_differ == 32 and bi.all_rows["3"].fwd_differ == 0
    assert all(c.rowgrad_differ == 0 for c in bi.all_rows.values())
    assert bi.batch_invariant is False


def test_each_per_row_gradient_is_compared(evidence):
    bi = evidence[0].results["plain"]["b_gradient_on_even_batches"].batch_invariance
    # only b's gradient changes; a's does not: the count is b's rows alone
    assert bi.all_rows["32"].rowgrad_differ == 32 and bi.all_rows["3"].rowgrad_differ == 0
    assert all(c.fwd_differ == 0 for c in bi.all_rows.values())
    assert bi.batch_invariant is False


def test_the_reports_render_the_toy_op(evidence, tmp_path):
    from h3bench.reports.render import render_all

    _, out = evidence
    paths = render_all(out, tmp_path)
    text = (tmp_path / f"{out.stem}.md").read_text()
    assert "toy_two_outputs" in text and "honest" in text and "grad b" in text.replace("_", " ")
    assert len(paths) == 5

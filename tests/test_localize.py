"""Localisation in the assertion: a fault planted in one custom op of one module (batch-variant in forward,
in backward only, dependent on the row's position, different run to run) is named by its module, op and
phase; an honest model has no origin. The models compute exactly (tests/planted_models.py), so nothing here
depends on which kernel the CPU's BLAS picks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from h3bench.harness.localize.compare import Pairing, tensor_equal
from h3bench.harness.localize.digest import digest, seen
from h3bench.testing import assert_batch_invariant, check_batch_invariance
from tests.planted_models import OP_NAMES, PlantedModel, examples, run_shift


def test_an_honest_model_has_no_origin():
    record = assert_batch_invariant(PlantedModel(), examples(), per_row=["x"])
    assert record.origins == () and record.localisations == ()


@pytest.mark.parametrize("fault, phase", [("forward", "forward"), ("backward", "backward"),
                                          ("position", "forward"), ("repeat", "forward")])
def test_a_planted_fault_is_named_by_module_op_and_phase(fault, phase):
    record = check_batch_invariance(PlantedModel(fault=fault), examples(), per_row=["x"])
    assert not record.invariant
    first = record.origins[0]
    assert (first.module, first.module_type, first.phase) == ("blocks.1.gate", "Fault", phase)
    assert first.op == OP_NAMES[fault]
    if fault == "backward":  # the op that ran in backward is the planted op's gradient
        assert first.backward_op == OP_NAMES["forward"] and "grad_batch_scale" in first.node
    assert first.rows and first.max_ulp and first.max_ulp > 0
    assert [o for o in record.origins if o.module != "blocks.1.gate"] == []  # the rest only inherit it
    search = record.localisations[0]
    assert search.reproduced and search.runs == 3 and search.streams == {"forward": "aligned", "backward": "aligned"}
    assert sum(search.inherited_ops.values()) > 0
    assert f"first origin: {phase} {OP_NAMES[fault]}" in record.message()
    assert "in blocks.1.gate (Fault)" in record.message()


def test_a_plain_function_names_modules_from_the_outermost_module_it_calls():
    model = PlantedModel(fault="forward", where=0)
    record = check_batch_invariance(lambda x: model(x), examples(), per_row=["x"], locate=True)
    assert (record.origins[0].module, record.origins[0].op) == ("blocks.0.gate", OP_NAMES["forward"])


def test_locate_is_off_for_a_plain_function_unless_asked():
    model = PlantedModel(fault="forward")
    assert check_batch_invariance(lambda x: model(x), examples(), per_row=["x"]).localisations == ()
    assert check_batch_invariance(model, examples(), per_row=["x"], locate=False).localisations == ()


class _Weighted(nn.Module):
    """run_shift(x) @ w: the rows made different on every run, so the weight's gradient does not repeat."""

    def __init__(self):
        super().__init__()
        self.shift = nn.Identity()

    def forward(self, x, w):
        return run_shift(self.shift(x)) @ w


def test_parameter_gradients_that_do_not_repeat_are_localised_run_to_run():
    x = (torch.randint(-4, 5, (4, 8)).float() / 4).requires_grad_()
    w = (torch.randint(-2, 3, (8, 8)).float() / 4).requires_grad_()
    record = check_batch_invariance(_Weighted(), {"x": x, "w": w}, per_row=["x"])
    repeat = [o for o in record.origins if o.search == "repeat"]
    assert repeat and repeat[0].op == OP_NAMES["repeat"] and repeat[0].module == ""
    assert repeat[0].phase == "forward" and repeat[0].rows == list(range(32))  # all_rows' largest batch, all rows
    assert record.localisations[-1].check == "param_grads"


class _BatchBranch(nn.Module):
    """One extra op when the batch has more than one row: control flow that depends on the batch."""

    def __init__(self):
        super().__init__()
        self.inner = PlantedModel()

    def forward(self, x):
        y = self.inner(x)
        return y + 1e-3 * torch.sin(y) if x.shape[0] > 1 else y


def test_streams_that_part_say_where():
    record = check_batch_invariance(_BatchBranch(), examples(), per_row=["x"], grads=False)
    search = record.localisations[0]
    assert search.streams["forward"].startswith("forward op streams part at op")
    assert "the batch ran aten::sin in (the checked object)" in search.streams["forward"]


def test_a_flattened_batch_maps_rows_to_contiguous_blocks():
    batch, alone = torch.randn(3, 4, 5), None
    alone = batch[1:2].clone()
    flat_batch, flat_alone = batch.reshape(12, 5), alone.reshape(4, 5)
    a = seen(flat_batch, digest(flat_batch, 3).tolist(), 3)
    b = seen(flat_alone, digest(flat_alone, 1).tolist(), 1)
    pairing = Pairing("batch", 3, 1, (1,), (0,))
    assert tensor_equal(a, b, pairing) == ((True,), False)
    other = Pairing("batch", 3, 1, (2,), (0,))
    assert tensor_equal(a, b, other) == ((False,), False)
    seq_first = seen(batch.transpose(0, 1), digest(batch.transpose(0, 1), 3).tolist(), 3)  # [T, B, H]: not row-major
    assert tensor_equal(seq_first, seen(alone.transpose(0, 1), digest(alone.transpose(0, 1), 1).tolist(), 1),
                        pairing) == (None, False)

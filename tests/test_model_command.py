"""`h3bench model`: the evidence file and its Markdown for a model with a planted fault, validate knows the
file, --require-invariant, modes in their own processes, and bad input as one line, exit 2, nothing
written."""
from __future__ import annotations

import json

import pytest
import torch

from h3bench.harness.model_audit.command import ModelOptions, run
from h3bench.harness.model_audit.factory import build
from h3bench.harness.model_audit.op_audit import audit
from h3bench.harness.localize.records import Origin, TensorShape
from h3bench.harness import model_schema
from h3bench.reports.model_markdown import write_markdown
from tests.planted_models import OP_NAMES

PLANTED = "tests/planted_models.py"


def _run(tmp_path, spec, **options):
    said, warned = [], []
    out = tmp_path / "model.json"
    code = run(ModelOptions(spec=spec, device="cpu", out=out, **options), render=write_markdown,
               say=said.append, warn=warned.append)
    return code, out, said, warned


def test_a_planted_fault_is_named_in_the_file_and_the_markdown(tmp_path):
    code, out, said, _ = _run(tmp_path, f"{PLANTED}:build_forward")
    assert code == 0
    data = json.loads(out.read_text())
    problems, what = model_schema.validate(data)
    assert problems == [] and "not invariant" in what
    plain = data["modes"]["plain"]
    assert (plain["origins"][0]["module"], plain["origins"][0]["op"]) == ("blocks.1.gate", OP_NAMES["forward"])
    assert data["parameters"] == 4 and "count" in plain["origins"][0]
    markdown = out.with_suffix(".md").read_text()
    assert "| 1 | batch | forward | `blocks.1.gate` (Fault) | `h3plant::batch_scale` |" in markdown
    assert any("origin: forward h3plant::batch_scale in blocks.1.gate" in line for line in said)


def test_require_invariant_exits_1_for_a_variant_model_and_0_for_an_honest_one(tmp_path):
    assert _run(tmp_path, f"{PLANTED}:build_forward", require_invariant=True)[0] == 1
    code, out, _, _ = _run(tmp_path, f"{PLANTED}:build_honest", require_invariant=True, force=True)
    assert code == 0 and json.loads(out.read_text())["modes"]["plain"]["origins"] == []


def test_validate_knows_a_model_file_and_names_its_problems(tmp_path):
    _, out, _, _ = _run(tmp_path, f"{PLANTED}:build_honest")
    data = json.loads(out.read_text())
    data["modes"]["plain"]["invariant"] = False
    problems, _ = model_schema.validate(data)
    assert problems == ["$.modes.plain.invariant: False, but the counts say True"]
    del data["device"]
    assert model_schema.validate(data)[0] == ["$: missing key 'device'"]


def test_a_mode_that_cannot_import_is_unavailable_with_its_reason(tmp_path, fake_modes):
    code, out, _, _ = _run(tmp_path, f"{PLANTED}:build_honest", modes=["plain,fake_unimportable"])
    data = json.loads(out.read_text())
    assert code == 0 and data["modes"]["plain"]["invariant"] is True
    assert "no_such_batch_invariant_library" in data["modes"]["fake_unimportable"]["unavailable"]


def _compile_into_a_batch_variant_graph(fn, **_options):
    """A stand-in for torch.compile whose "compiled graph" gives a row other bits above 2 rows, as a
    generated kernel that picks its strategy by the batch would; eager stays exact."""
    def compiled(**inputs):
        outs = fn(**inputs)  # the checked call's outputs, a tuple
        return tuple(o * (1 + 2 ** -10) for o in outs) if inputs["x"].shape[0] > 2 else outs
    return compiled


def test_compile_names_the_first_differing_batch_and_that_the_variance_is_in_the_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", _compile_into_a_batch_variant_graph)
    code, out, said, _ = _run(tmp_path, f"{PLANTED}:build_honest", compile="default", require_invariant=True)
    compiled = json.loads(out.read_text())["compiled"]
    assert [(b["batch"], b["differ"], b["eager_differ"]) for b in compiled["batches"]] == \
        [(4, False, False), (2, True, False), (1, True, False)]
    assert compiled["first_differing"] == 2 and "inside the compiled graph" in compiled["inside_graph"]
    assert code == 1  # the eager model is invariant, the compiled one is not
    assert model_schema.validate(json.loads(out.read_text()))[0] == []


@pytest.mark.parametrize("spec, words", [
    ("missing/" + "model.py:build", "no such file"),
    (f"{PLANTED}:no_such_factory", "has no attribute 'no_such_factory'"),
    (f"{PLANTED}:build_raises", "the factory raised RuntimeError: no weights here"),
    (f"{PLANTED}:build_wrong", "returned PlantedModel, expected (model, examples, per_row)"),
    (f"{PLANTED}:build_uneven", "per-row inputs must share their first dimension"),
    (f"{PLANTED}:build_scalar_output", "output 'loss' has shape ()"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, spec, words):
    code, out, said, warned = _run(tmp_path, spec)
    assert code == 2 and not out.exists() and said == []
    assert len(warned) == 1 and words in warned[0] and "\n" not in warned[0]


def test_a_dict_output_compares_every_tensor_in_it():
    found = build(f"{PLANTED}:build_honest", torch.device("cpu"), None)
    assert found.output_names == ["out"] and found.per_row == ["x"]
    assert sorted(k for k in found.examples if k.startswith("param:")) == [
        "param:blocks.0.down.weight", "param:blocks.0.up.weight", "param:blocks.1.down.weight",
        "param:blocks.1.up.weight"]


def test_an_origin_op_gets_the_built_in_op_that_audits_it():
    mm = Origin(search="batch", phase="forward", module="layers.0.mlp.up_proj", module_type="Linear", op="aten::mm",
                inputs=[TensorShape([18, 32], "float32"), TensorShape([32, 128], "float32")],
                outputs=[TensorShape([18, 128], "float32")], rows=[0], instances=["layers.0.mlp.up_proj"], count=1)
    assert audit(mm).command == "h3bench run --op linear --set in_features=32 --set out_features=128 --set dtype=float32"
    norm = Origin(search="batch", phase="forward", module="norm", module_type="LlamaRMSNorm", op="aten::mul",
                  inputs=[], outputs=[TensorShape([4, 6, 32], "bfloat16")], rows=[0], instances=["norm"], count=1)
    assert audit(norm).command == "h3bench run --op rms_norm --set hidden=32 --set dtype=bfloat16"
    mlp = Origin(search="batch", phase="forward", module="timestep_mlp.linear_1", module_type="Linear",
                 op="aten::addmm", inputs=[TensorShape([64], "float32"), TensorShape([3, 16], "float32")],
                 outputs=[TensorShape([3, 64], "float32")], rows=[0], instances=["timestep_mlp.linear_1"], count=1)
    # every line is a command `h3bench run` takes: timestep_mlp's config has no dtype key to set
    assert audit(mlp).command == "h3bench run --op timestep_mlp"
    from h3bench.harness.config import load_config
    for found in (mm, norm, mlp):
        words = audit(found).command.split()
        load_config(words[3], None, True, tuple(w for w in words[4:] if w != "--set"))


@pytest.mark.parametrize("spec", ["docs/examples/h3_block.py:build", "docs/examples/wan_dit.py:build",
                                  "docs/examples/llama_lm.py:build_split_k"])
def test_the_examples_build_and_return_per_row_outputs(spec):
    if "llama" in spec:
        pytest.importorskip("transformers", reason="the transformers extra is not installed")
    found = build(spec, torch.device("cpu"), None)
    rows = found.inputs[found.per_row[0]].shape[0]
    assert all(t.shape[0] == rows for t in found.call(**found.inputs))


def test_bad_options_are_one_line_exit_2_and_nothing_written(tmp_path):
    for options, words in (({"mode_timeout_s": 0.0}, "--mode-timeout 0: must be a positive"),
                           ({"compile": "fastest"}, "--compile fastest"), ({"dtype": "int8"}, "--dtype int8")):
        code, out, said, warned = _run(tmp_path, f"{PLANTED}:build_honest", **options)
        assert code == 2 and not out.exists() and said == [], (options, said)
        assert len(warned) == 1 and words in warned[0], (options, warned)

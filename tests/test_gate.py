"""`h3bench run --require-invariant`: exit 1 naming each selected row that breaks the reuse rule (not
batch-invariant, parameter gradients not repeatable, unavailable), 0 otherwise, 2 on a bad selection."""
from __future__ import annotations

import pytest

from h3bench.harness import gate, schema
from h3bench.harness.schema import UnavailableMode, UnavailableRow
from tests.helpers import composition, even, require_prior_art


def on_even_batches(x, w, sh, sc, idx):
    """A planted fault: a row's output moves by one ulp-ish step when its batch has an even row count."""
    y = composition(x, w, sh, sc, idx)
    return y * (1 + 2 ** -7) if even(x) else y


def test_the_prior_art_verdicts_become_failures():
    ev = schema.load(require_prior_art())
    lines = gate.failures(ev, gate.ALL)
    failing = {line.split(" [")[0] for line in lines}
    assert failing == {"norm_modulate/diffusers", "norm_modulate/liger"}, lines
    assert any("parameter gradients not repeatable" in line for line in lines)
    assert gate.failures(ev, frozenset({"torch_rms_norm", "rl_kernel"})) == []


def test_unavailable_rows_and_modes_fail():
    ev = schema.load(require_prior_art())
    ev.results["plain"]["torch_rms_norm"] = UnavailableRow(unavailable="ImportError: planted")
    ev.results["vllm"] = UnavailableMode(unavailable="child crashed")
    lines = gate.failures(ev, frozenset({"torch_rms_norm"}))
    assert lines == ["norm_modulate/torch_rms_norm [plain]: unavailable: ImportError: planted",
                     "norm_modulate [vllm]: mode unavailable: child crashed"]


def test_a_mode_tagged_row_is_judged_by_its_untagged_name():
    """`--require-invariant diffusers` with `--mode vllm`: the vllm mode's row is `diffusers[vllm]`
    (Op.mode_tagged_rows); the gate judges it, it does not pass for want of a row called `diffusers`."""
    ev = schema.load(require_prior_art())
    failing = ev.results["plain"]["diffusers"]
    ev.results = {"plain": {"torch_rms_norm": ev.results["plain"]["torch_rms_norm"]},
                  "vllm": {"diffusers[vllm]": failing}}
    verdict = gate.judge([ev], frozenset({"diffusers"}))
    assert not verdict.passed
    assert verdict.judged == ("norm_modulate/diffusers[vllm] [vllm]",)
    assert [line.split(":")[0] for line in verdict.failures] == ["norm_modulate/diffusers[vllm] [vllm]"]


def test_a_selected_row_no_file_holds_fails_and_a_pass_lists_the_rows_judged():
    ev = schema.load(require_prior_art())
    verdict = gate.judge([ev], frozenset({"torch_rms_norm", "mine"}))
    assert verdict.failures == ("mine: selected, but no file of the run holds this row",)
    passed = gate.judge([ev], frozenset({"torch_rms_norm", "rl_kernel"}))
    assert passed.passed and set(passed.judged) == {
        f"norm_modulate/{row} [{mode}]" for mode, rows in ev.results.items() for row in rows
        if row in ("torch_rms_norm", "rl_kernel")}


@pytest.mark.parametrize("text,expected", [("all", gate.ALL), ("a, b", frozenset({"a", "b"})),
                                           ("a,all", gate.ALL)])
def test_selection(text, expected):
    assert gate.parse_selection(text) == expected


def test_an_empty_selection_is_refused():
    with pytest.raises(ValueError, match="name rows"):
        gate.parse_selection(" , ")


def run(invoke, tmp_path, *extra):
    return invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm", "--no-render",
                  "--adapter", "tests.test_gate:on_even_batches", "--out", str(tmp_path / "x.json"), "--force", *extra)


def test_exit_1_names_the_failing_row_and_0_for_the_clean_one(invoke, tmp_path):
    result, text = run(invoke, tmp_path, "--require-invariant", "all")
    assert result.exit_code == 1, text
    assert "norm_modulate/on_even_batches [plain]: NOT batch-invariant" in text
    assert "torch_rms_norm [plain]: NOT" not in text
    result, text = run(invoke, tmp_path, "--require-invariant", "torch_rms_norm")
    assert result.exit_code == 0 and "every selected row is batch-invariant" in text, text
    result, text = run(invoke, tmp_path)  # no gate: the run's verdicts are in the file, exit 0
    assert result.exit_code == 0, text


def test_a_row_the_run_does_not_have_is_refused_before_running(invoke, tmp_path):
    result, text = run(invoke, tmp_path, "--require-invariant", "torch_rms_norm,no_such_row")
    assert result.exit_code == 2 and "no_such_row" in text and "on_even_batches" in text, text
    assert not (tmp_path / "x.json").exists()


def test_the_summary_names_the_checks_that_failed(invoke, tmp_path):
    result, text = run(invoke, tmp_path)
    assert result.exit_code == 0, text
    assert "not invariant: on_even_batches: all_rows" in text and "sweep:" in text
    assert "not invariant: torch_rms_norm" not in text


def test_a_user_row_named_like_a_built_in_one_is_refused_not_renamed(invoke, tmp_path):
    """The gate judged the built-in `torch_rms_norm` while the user's function, renamed away, failed: a
    name taken is one line and exit 2, before anything runs."""
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm", "--no-render",
                          "--adapter", "torch_rms_norm=tests.test_gate:on_even_batches",
                          "--require-invariant", "torch_rms_norm", "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert "the row name torch_rms_norm is taken by the built-in row" in text, text
    assert not (tmp_path / "x.json").exists()
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "none", "--no-render",
                          "--adapter", "mine=tests.test_gate:on_even_batches",
                          "--adapter", "mine=tests.test_gate:on_even_batches", "--out", str(tmp_path / "y.json"))
    assert result.exit_code == 2 and "taken by another --adapter" in text, text
    assert not (tmp_path / "y.json").exists()


def test_the_gate_line_lists_the_rows_it_judged(invoke, tmp_path):
    result, text = run(invoke, tmp_path, "--require-invariant", "torch_rms_norm")
    assert result.exit_code == 0, text
    assert text.endswith("rows judged: norm_modulate/torch_rms_norm [plain]"), text
    result, text = run(invoke, tmp_path, "--require-invariant", "all")
    assert result.exit_code == 1, text
    assert "required invariance: FAILED; rows judged: norm_modulate/torch_rms_norm [plain], " \
           "norm_modulate/on_even_batches [plain]" in text, text

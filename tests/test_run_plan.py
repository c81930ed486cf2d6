"""Which plan `h3bench run` takes and says it took: --quick or --full, else the plan the --config file sets
(`quick = true` or `false`), else the device's (quick on a CPU, full on CUDA); a config file alone (its
sizes) keeps the device's plan."""
from __future__ import annotations

import pytest

from h3bench.harness import runner
from h3bench.harness.commands import BadInput
from h3bench.harness.commands.plan import choose_plan

RUN = ("run", "--op", "norm_modulate", "--device", "cpu", "--adapters", "torch_rms_norm", "--no-render")


@pytest.fixture
def started(monkeypatch):
    """The requests a run starts, caught before anything is measured (the run stops there as if interrupted)."""
    seen = []

    def caught(request, observer=None):
        seen.append(request)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", caught)
    return seen


def _config(tmp_path, text: str):
    path = tmp_path / "mycfg.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("flags, quick, said", [
    ((), True, "plan quick (the CPU default; --full for the full plan)"),
    (("--full",), False, "plan full (--full)"),
    (("--quick",), True, "plan quick (--quick)"),
])
def test_the_header_says_where_the_plan_came_from(invoke, started, tmp_path, flags, quick, said):
    result, text = invoke(*RUN, *flags, "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 130, text
    assert f"h3bench: op norm_modulate, device cpu, {said}, modes plain" in text, text
    assert started[0].config.quick is quick


def test_a_config_file_that_sets_no_plan_keeps_the_devices(invoke, started, tmp_path):
    """Only `hidden = 32`: the quick plan on a CPU (it was the full plan, about an hour, unannounced)."""
    config = _config(tmp_path, "[inputs]\nhidden = 32\n")
    result, text = invoke(*RUN, "--config", str(config), "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 130, text
    assert "plan quick (the CPU default; --full for the full plan)" in text
    cfg = started[0].config
    assert cfg.quick and cfg.plans == "quick" and cfg.inputs.hidden == 32


@pytest.mark.parametrize("value, quick, plans", [("false", False, "token"), ("true", True, "quick")])
def test_a_config_file_that_sets_the_plan_is_followed_and_named(invoke, started, tmp_path, value, quick, plans):
    config = _config(tmp_path, f"quick = {value}\n\n[inputs]\nhidden = 32\n")
    result, text = invoke(*RUN, "--config", str(config), "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 130, text
    assert f"plan {'quick' if quick else 'full'} ({config}: quick = {value})" in text, text
    cfg = started[0].config
    assert cfg.quick is quick and cfg.plans == plans and cfg.inputs.hidden == 32


@pytest.mark.parametrize("text, flag, says", [
    ("quick = true\n", "--full", "sets quick = true (the quick plan); give the plan once"),
    ("quick = false\n", "--quick", "sets quick = false (the full plan); give the plan once"),
    ('quick = "yes"\n', "--quick", "quick must be true (the quick plan) or false (the full plan), got 'yes'"),
])
def test_a_plan_the_flag_and_the_file_disagree_on_or_a_bad_value_is_one_line(invoke, started, tmp_path, text, flag,
                                                                             says):
    config = _config(tmp_path, text)
    out = tmp_path / "runs" / "x.json"
    result, output = invoke(*RUN, flag, "--config", str(config), "--out", str(out))
    assert result.exit_code == 2 and says in output and str(config) in output, output
    assert len(result.output.strip().splitlines()) == 1 and not started and not out.parent.exists()


def test_cuda_takes_the_full_plan_unless_told():
    assert choose_plan(False, False, None, "cuda").describe() == \
        "plan full (the CUDA default; --quick for the quick plan)"
    assert choose_plan(True, False, None, "cuda").describe() == "plan quick (--quick)"
    assert choose_plan(False, False, None, "cpu").quick


def test_a_file_plan_is_read_from_the_file_alone(tmp_path):
    with pytest.raises(BadInput, match="config file not found"):
        choose_plan(False, False, tmp_path / "missing.toml", "cpu")
    assert choose_plan(False, False, _config(tmp_path, "quick = false\n"), "cpu").describe() == \
        f"plan full ({tmp_path / 'mycfg.toml'}: quick = false)"


def test_a_long_header_folds_within_the_piped_width_between_words(started, tmp_path):
    """Every built-in row named: the header is longer than a piped line and folds, no row name cut."""
    from typer.testing import CliRunner

    from h3bench.cli import app
    from h3bench.harness.console import PIPED_TABLE_WIDTH

    result = CliRunner().invoke(app, ["run", "--device", "cpu", "--no-render", "--out", str(tmp_path / "x.json")],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 130, result.output
    lines = result.output.splitlines()
    header = lines[:next(i for i, line in enumerate(lines) if line.startswith("interrupted"))]
    assert len(header) > 1 and all(len(line) <= PIPED_TABLE_WIDTH for line in header), header
    rows = " ".join(" ".join(header).split()).split(", rows ")[1].split("; ")[0].split(", ")
    assert rows == [a.name for a in started[0].adapters]

"""Bringing one's own function with `--adapter`: the op's signature is printed by `list --op`, the op's
constants reach a function that names them (so `--set eps=...` is not silently ignored), `name=` names the
row, a .py path or a module in the current directory loads, and `--forward-only` declares no backward."""
from __future__ import annotations

import json
import textwrap

import pytest

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    SEEN = []

    def with_eps(x, w, sh, sc, idx, *, eps):
        SEEN.append(eps)
        y = F.rms_norm(x, (x.shape[-1],), w, eps)
        return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)

    def no_backward(x, w, sh, sc, idx, eps=1e-5):
        with torch.no_grad():
            return with_eps(x, w, sh, sc, idx, eps=eps)
''')


@pytest.fixture
def module_file(tmp_path):
    path = tmp_path / "mykernels.py"
    path.write_text(SOURCE)
    return path


def rows_of(path) -> dict:
    return json.loads(path.read_text())["results"]["plain"]


def run(invoke, out, *extra):
    return invoke("run", "--device", "cpu", "--quick", "--adapters", "none", "--no-render", "--quiet",
                  "--set", "hidden=16", "--out", str(out), *extra)


def test_list_prints_the_signature(invoke):
    result, text = invoke("list", "--op", "norm_modulate", "--device", "cpu")
    assert result.exit_code == 0, text
    assert "def my_norm_modulate(x, w, sh, sc, idx, *, eps=1e-05): # -> y" in text
    assert "x [R, hidden] bfloat16 per row (dim 0 is the row); gets a gradient" in text
    assert "idx [R] int64 per row (dim 0 is the row); no gradient" in text
    assert "sh [timesteps*modalities, hidden] bfloat16 shared by every row; gets a gradient" in text
    assert "y [R, hidden] bfloat16" in text and "y = rms_norm(x, eps) * w * (1 + sc[idx]) + sh[idx]" in text
    assert "constants (keyword arguments, from the config: --set NAME=VALUE): eps=1e-05" in text


def test_constants_reach_the_function_and_name_names_the_row(invoke, tmp_path, module_file):
    out = tmp_path / "x.json"
    result, text = run(invoke, out, "--adapter", f"mine={module_file}:with_eps", "--set", "eps=0.001")
    assert result.exit_code == 0, text
    row = rows_of(out)["mine"]
    assert "constants eps=0.001" in row["source"] and row["has_backward"] is True


def test_a_module_in_the_current_directory_loads(invoke, tmp_path, module_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "y.json"
    result, text = run(invoke, out, "--adapter", "mykernels:with_eps")
    assert result.exit_code == 0, text
    assert "constants eps=1e-05" in rows_of(out)["with_eps"]["source"]


def test_forward_only_declares_no_backward(invoke, tmp_path, module_file):
    out = tmp_path / "z.json"
    result, text = run(invoke, out, "--adapter", f"{module_file}:no_backward", "--forward-only")
    assert result.exit_code == 0, text
    row = rows_of(out)["no_backward"]
    assert row["has_backward"] is False and "unavailable" not in row
    result, text = run(invoke, tmp_path / "w.json", "--adapter", f"{module_file}:no_backward")
    assert "unavailable" in rows_of(tmp_path / "w.json")["no_backward"]  # asked for gradients it cannot give


@pytest.mark.parametrize("spec,says", [("=mod:fn", "expects [name=]module:attr"),
                                       ("./missing.py:fn", "no such file")])
def test_bad_specs_are_one_line(invoke, tmp_path, spec, says):
    result, text = run(invoke, tmp_path / "x.json", "--adapter", spec)
    assert result.exit_code == 2 and says in text and "Traceback" not in result.output, text


def test_forward_only_needs_an_adapter(invoke, tmp_path):
    result, text = run(invoke, tmp_path / "x.json", "--forward-only")
    assert result.exit_code == 2 and "--forward-only" in text, text

"""`h3bench validate` checks meaning as well as keys: each planted contradiction is named, every file is
checked (a bad one does not stop the rest), and no input prints a traceback."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from h3bench.harness import schema, semantics
from tests.helpers import require_prior_art

EVIDENCE = Path(__file__).resolve().parents[1] / "reports" / "evidence"


def prior() -> dict:
    return json.loads(require_prior_art().read_text())


def torch_row(data: dict) -> dict:
    return data["results"]["plain"]["torch_rms_norm"]




def planted(change) -> list[str]:
    data = prior()
    change(data)
    return semantics.problems(schema.from_json(data))


def test_the_prior_art_means_what_it_says():
    assert semantics.problems(schema.load(require_prior_art())) == []


@pytest.mark.parametrize("change,says", [
    (lambda d: torch_row(d)["accuracy_latency"]["4097"].update(fwd_us=math.nan), "fwd_us: nan"),
    (lambda d: torch_row(d)["accuracy_latency"]["4097"].update(fwd_us=-3.0), "fwd_us: -3.0"),
    (lambda d: torch_row(d)["accuracy_latency"]["4097"]["grad_rel_err"].update(x=math.inf), "grad_rel_err.x: inf"),
    (lambda d: d.update(op="no_such_op"), "'no_such_op' is not an op"),
    (lambda d: d.update(results={"plain": {}}), "no mode has a row"),
    (lambda d: torch_row(d)["batch_invariance"].update(params_repeatable=False), "batch_invariant: True but"),
    (lambda d: torch_row(d)["batch_invariance"]["all_rows"]["64"].update(fwd_differ=500), "not within 0..192"),
    (lambda d: torch_row(d)["batch_invariance"]["batch_size_sweep"].update(differ=3000), "not within 0..2256"),
])
def test_each_contradiction_is_named(change, says):
    found = planted(change)
    assert any(says in line for line in found), found


def test_counts_are_checked_against_the_recorded_plan():
    from h3bench.harness.config import load_config
    data = prior()
    data["config"] = schema.to_dict(load_config("norm_modulate"))
    assert semantics.problems(schema.from_json(data)) == []
    torch_row(data)["batch_invariance"]["batch_size_sweep"]["comparisons"] = 2255
    found = semantics.problems(schema.from_json(data))
    assert any("comparisons: 2255, the recorded plan gives 2256" in line for line in found), found


def test_a_sweep_file_validates_as_its_own_kind():
    data = json.loads((EVIDENCE / "sweep_norm_modulate_h200.json").read_text())
    assert semantics.is_sweep(data) and semantics.sweep_problems(data) == []
    data["hidden_sweep"][0]["rows"]["ours"]["fwd"]["sync_us"] = math.nan
    assert any("sync_us: nan" in line for line in semantics.sweep_problems(data))


def test_every_committed_json_means_what_it_says():
    for path in sorted(EVIDENCE.rglob("*.json")):
        data = json.loads(path.read_text())
        found = (semantics.sweep_problems(data) if semantics.is_sweep(data)
                 else semantics.problems(schema.from_json(data)))
        assert found == [], (path, found)


def test_validate_checks_every_file_without_a_traceback(invoke, tmp_path):
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    bad = tmp_path / "bad.json"
    data = prior()
    torch_row(data)["accuracy_latency"]["4097"]["fwd_us"] = -1.0
    bad.write_text(json.dumps(data))
    result, text = invoke("validate", str(binary), str(bad), str(require_prior_art()), str(tmp_path))
    # every file is checked; a folder among them is bad input (exit 2), the others invalid or valid
    assert result.exit_code == 2 and "Traceback" not in result.output, text
    assert f"{binary}: invalid: not a text file" in text
    assert f"{bad}: invalid: $.results.plain.torch_rms_norm.accuracy_latency.4097.fwd_us: -1.0" in text
    assert f"{require_prior_art()}: valid" in text and f"{tmp_path}: a folder" in text
    result, text = invoke("validate", str(binary), str(bad), str(require_prior_art()))
    assert result.exit_code == 1, text

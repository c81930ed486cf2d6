"""The evidence file's contract: the prior art validates and round-trips, our files keep its keys,
broken files are refused with the JSON path named, and writes are atomic."""
from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest
import torch

from h3bench.harness import schema
from h3bench.harness.config import TimingPlan, load_config
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import (AllRowsCase, RowResult, SchemaError, SizeResult, UnavailableRow,
                            write_atomic)
from tests.helpers import require_prior_art

SIZE_KEYED = ("all_rows", "accuracy_latency")  # dict keys that are row counts: compared as "*"
GRAD_KEYED = ("grad_rel_err",)                 # dict keys that are gradient names


@pytest.fixture(scope="module")
def prior_path():
    return require_prior_art()


@pytest.fixture(scope="module")
def prior_data(prior_path) -> dict:
    return json.loads(prior_path.read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick CPU run of the diffusers and torch_rms_norm rows, written to disk: (path, JSON)."""
    from h3bench.adapters.norm_modulate.diffusers import ADAPTER as DIFFUSERS
    from h3bench.adapters.norm_modulate.torch_rms_norm import ADAPTER as TORCH_RMS_NORM

    config = load_config("norm_modulate", quick=True)
    config = dataclasses.replace(config, timing=TimingPlan(warmup=0, reps=2, repeats=2, block=1))
    out = tmp_path_factory.mktemp("quick") / "quick.json"
    run(RunRequest(config=config, device=torch.device("cpu"), adapters=[DIFFUSERS, TORCH_RMS_NORM],
                   modes=["plain"], out=out, command="pytest"))
    return out, json.loads(out.read_text())


def key_paths(data, wildcard_grads: bool = False, path: str = "") -> set[str]:
    """Every key path in a JSON tree; row-count keys become '*' (and gradient names, if asked)."""
    out = set()
    if isinstance(data, dict):
        parent = path.rsplit(".", 1)[-1]
        for key, value in data.items():
            shown = "*" if parent in SIZE_KEYED or (wildcard_grads and parent in GRAD_KEYED) else key
            here = f"{path}.{shown}" if path else shown
            out.add(here)
            out |= key_paths(value, wildcard_grads, here)
    return out


def data_key_order(data) -> list[list[str]]:
    out = [list(data["results"])]
    for rows in data["results"].values():
        out.append(list(rows))
        for row in rows.values():
            if "accuracy_latency" in row:
                out.append(list(row["batch_invariance"]["all_rows"]))
                out.append(list(row["accuracy_latency"]))
                out += [list(size.get("grad_rel_err", {})) for size in row["accuracy_latency"].values()]
    return out


# --- the prior art ------------------------------------------------------------------------------------

def test_prior_art_validates_and_round_trips(prior_path, prior_data):
    evidence = schema.load(prior_path)
    assert schema.to_dict(evidence) == prior_data
    assert json.loads(schema.dumps(evidence)) == prior_data
    # maps keyed by data (rows, sizes, gradient names) keep their order; field order is free
    assert data_key_order(schema.to_dict(evidence)) == data_key_order(prior_data)
    assert set(evidence.results["plain"]) == {"diffusers", "torch_rms_norm", "transformer_engine", "liger",
                                              "liger_rlk_gather", "sglang", "rl_kernel"}


def test_key_paths_helper():
    assert key_paths({"a": {"all_rows": {"64": {"rows": 1}}, "b": [1]}}) == {
        "a", "a.all_rows", "a.all_rows.*", "a.all_rows.*.rows", "a.b"}


# --- a file of ours keeps the prior art's keys ------------------------------------------------------

def test_quick_file_validates(quick_run):
    path, data = quick_run
    evidence = schema.load(path)
    assert schema.to_dict(evidence) == data
    assert evidence.quick is True and evidence.command == "pytest"
    assert set(evidence.results["plain"]) == {"diffusers", "torch_rms_norm"}


def test_quick_file_has_the_prior_art_top_level_and_environment(quick_run, prior_data):
    _, ours = quick_run
    assert set(prior_data) <= set(ours)
    assert set(prior_data["environment"]) <= set(ours["environment"])
    assert set(prior_data["environment"]["libraries"]) <= set(ours["environment"]["libraries"])
    assert set(prior_data["results"]) <= set(ours["results"])
    assert set(prior_data["environment"]["mode_environment"]) <= set(ours["environment"]["mode_environment"])


@pytest.mark.parametrize("name", ["diffusers", "torch_rms_norm"])
def test_quick_rows_have_the_prior_art_row_keys(quick_run, prior_data, name):
    _, ours = quick_run
    mine, theirs = ours["results"]["plain"][name], prior_data["results"]["plain"][name]
    assert mine["has_backward"] is True
    # same row: same gradient names, every key path of the prior art's row
    missing = key_paths(theirs) - key_paths(mine)
    assert not missing, f"{name} lacks {sorted(missing)}"
    # any row with a backward: the prior-art diffusers row's key paths, gradient names aside
    missing = key_paths(prior_data["results"]["plain"]["diffusers"], True) - key_paths(mine, True)
    assert not missing, f"{name} lacks {sorted(missing)}"
    # and per row count, every key the prior art has for every one of its sizes
    prior_size_keys = set.union(*(set(v) for v in theirs["accuracy_latency"].values()))
    for size, result in mine["accuracy_latency"].items():
        assert prior_size_keys <= set(result), size


def test_forward_only_row_has_no_backward_keys():
    row = RowResult(source="s", has_backward=False, batch_invariance=None,  # type: ignore[arg-type]
                    accuracy_latency={"17": SizeResult(fwd_rel_err=0.0, fwd_us=1.0)})
    assert schema.to_dict(row)["accuracy_latency"] == {"17": {"fwd_rel_err": 0.0, "fwd_us": 1.0}}


# --- refusals name the JSON path ----------------------------------------------------------------------

def _delete(path):
    def change(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        del data[last]
    return change


def _set(path, value):
    def change(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        data[last] = value
    return change


ROW = ("results", "plain", "diffusers")
BROKEN = {
    "missing top-level key": (_delete(("quick",)), "$: missing key 'quick'"),
    "missing environment key": (_delete(("environment", "torch")), "$.environment: missing key 'torch'"),
    "missing deep key": (_delete((*ROW, "batch_invariance", "full_vs_sub_batches", "sub_batches")),
                         "$.results.plain.diffusers.batch_invariance.full_vs_sub_batches: "
                         "missing key 'sub_batches'"),
    "string for an integer": (_set((*ROW, "batch_invariance", "all_rows", "64", "rows"), "192"),
                              "$.results.plain.diffusers.batch_invariance.all_rows.64.rows: "
                              "expected an integer"),
    "bool for an integer": (_set((*ROW, "batch_invariance", "batch_size_sweep", "differ"), True),
                            "$.results.plain.diffusers.batch_invariance.batch_size_sweep.differ: "
                            "expected an integer"),
    "string for a number": (_set((*ROW, "accuracy_latency", "4097", "fwd_us"), "fast"),
                            "$.results.plain.diffusers.accuracy_latency.4097.fwd_us: expected a number"),
    "number for a bool": (_set(("quick",), 0), "$.quick: expected bool"),
    "list for an object": (_set(("environment",), []), "$.environment: expected an object"),
    "wrong kind": (_set(("kind",), "h3_something_else"), "$.kind: expected 'h3_prior_art'"),
    "mode missing from the environment": (_set(("environment", "mode_environment"), {}),
                                          "$.results.plain: mode missing"),
    "backward keys on a forward-only row": (
        _set(("results", "plain", "sglang", "accuracy_latency", "4097", "fwd_bwd_us"), 1.0),
        "$.results.plain.sglang.accuracy_latency.4097.fwd_bwd_us: present but has_backward is False"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_file_names_the_path(prior_data, case):
    change, message = BROKEN[case]
    data = copy.deepcopy(prior_data)
    change(data)
    with pytest.raises(SchemaError) as caught:
        schema.from_json(data)
    assert message in str(caught.value)


def test_unavailable_row_round_trips(prior_data):
    data = copy.deepcopy(prior_data)
    data["results"]["plain"]["vllm"] = {"unavailable": "ImportError: No module named 'vllm'"}
    evidence = schema.from_json(data)
    assert evidence.results["plain"]["vllm"] == UnavailableRow(unavailable="ImportError: No module named 'vllm'")
    assert schema.to_dict(evidence) == data


def test_not_json_is_a_schema_error(tmp_path):
    path = tmp_path / "half.json"
    path.write_text('{"kind": "h3_prior_art", ')
    with pytest.raises(SchemaError, match="not JSON"):
        schema.load(path)


# --- additive keys -----------------------------------------------------------------------------------

def test_additive_keys_are_omitted_when_none_and_kept_otherwise():
    assert schema.to_dict(UnavailableRow(unavailable="E: m")) == {"unavailable": "E: m"}
    assert schema.to_dict(UnavailableRow(unavailable="E: m", failed_probe="all_rows", wall_s=0.0)) == {
        "unavailable": "E: m", "failed_probe": "all_rows", "wall_s": 0.0}
    size = SizeResult(fwd_rel_err=0.5, fwd_us=2.0, grad_rel_err={"x": 0.25})
    assert schema.to_dict(size) == {"fwd_rel_err": 0.5, "fwd_us": 2.0, "grad_rel_err": {"x": 0.25}}


GRAPH_PEAK_FLUSH_KEYS = ("fwd_graph_us", "fwd_bwd_graph_us", "fwd_bwd_net_graph_us", "graph_unavailable",
                         "fwd_peak_bytes", "fwd_bwd_peak_bytes", "fwd_bwd_net_peak_bytes")


def test_graph_peak_and_flush_keys_round_trip_and_the_prior_art_has_none(prior_path, prior_data):
    evidence = schema.load(prior_path)
    assert evidence.environment.timing is None
    for row in evidence.results["plain"].values():
        for result in row.accuracy_latency.values():
            assert all(getattr(result, key) is None for key in GRAPH_PEAK_FLUSH_KEYS)
    assert schema.to_dict(evidence) == prior_data   # absent stays absent
    evidence.environment.timing = schema.TimingRecord(
        sample="synchronized", stream="back-to-back", timer="cuda_events", warmup=20, reps=100, repeats=2,
        block=20, interleaved="rows round-robin", graph="cuda_graph replay, per-sample synchronized",
        flush_l2=True, flush_bytes=256 << 20, flush_applies_to="each synchronized and graph sample")
    result = evidence.results["plain"]["rl_kernel"].accuracy_latency["4097"]
    result.fwd_graph_us, result.fwd_graph_us_repeat, result.fwd_bwd_net_graph_us = 9.5, 9.75, 30.25
    result.graph_unavailable = {"fwd_bwd": "RuntimeError: CUDA error: operation not permitted when stream is "
                                           "capturing"}
    result.fwd_peak_bytes, result.fwd_bwd_net_peak_bytes = 4096 * 5376 * 2, 3 << 20
    data = json.loads(schema.dumps(evidence))
    back = schema.from_json(data)
    assert back == evidence
    size = data["results"]["plain"]["rl_kernel"]["accuracy_latency"]["4097"]
    assert size["graph_unavailable"] == result.graph_unavailable and size["fwd_peak_bytes"] == 4096 * 5376 * 2
    assert "fwd_bwd_graph_us" not in size and "fwd_bwd_peak_bytes" not in size
    assert data["environment"]["timing"]["flush_l2"] is True
    from h3bench.harness import semantics
    assert semantics.problems(back) == []


def test_a_fractional_peak_is_refused(prior_data):
    data = copy.deepcopy(prior_data)
    data["results"]["plain"]["rl_kernel"]["accuracy_latency"]["4097"]["fwd_peak_bytes"] = 1.5
    with pytest.raises(SchemaError, match=r"4097\.fwd_peak_bytes: expected an integer"):
        schema.from_json(data)


def test_contract_keys_are_kept_when_none(prior_path):
    evidence = schema.load(prior_path)
    evidence.environment.gpu = None
    row = evidence.results["plain"]["transformer_engine"]
    assert row.batch_invariance.params_repeatable is None
    data = schema.to_dict(evidence)
    assert data["environment"]["gpu"] is None and "megatron_source_commit" in data["environment"]
    assert data["results"]["plain"]["transformer_engine"]["batch_invariance"]["params_repeatable"] is None
    assert "h3bench_commit" not in data and "device" not in data["environment"]


def test_all_rows_case_is_a_plain_object():
    assert schema.to_dict({"64": AllRowsCase(rows=192, fwd_differ=0, rowgrad_differ=1)}) == {
        "64": {"rows": 192, "fwd_differ": 0, "rowgrad_differ": 1}}


# --- atomic writes -----------------------------------------------------------------------------------

def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "e.json"
    path.write_text("old\n")
    assert write_atomic(path, "new\n") == path
    assert path.read_text() == "new\n"
    assert os.listdir(tmp_path) == ["e.json"]


def test_write_atomic_creates_the_folder(tmp_path):
    path = tmp_path / "a" / "b" / "e.json"
    write_atomic(path, "x")
    assert path.read_text() == "x"


class Boom(OSError):
    pass


def _raise(*_args, **_kwargs):
    raise Boom("disk full")


@pytest.mark.parametrize("where", ["fsync", "write", "replace"])
def test_write_atomic_failure_keeps_the_old_file(tmp_path, monkeypatch, where):
    path = tmp_path / "e.json"
    path.write_text("old\n")
    if where == "fsync":
        monkeypatch.setattr(schema.os, "fsync", _raise)
    elif where == "replace":
        monkeypatch.setattr(schema.os, "replace", _raise)
    else:
        real_fdopen = os.fdopen

        def fdopen(fd, *args, **kwargs):
            handle = real_fdopen(fd, *args, **kwargs)

            def write(text):
                handle.__class__.write(handle, text[: len(text) // 2])  # half a file, then fail
                raise Boom("disk full")
            handle.write = write
            return handle
        monkeypatch.setattr(schema.os, "fdopen", fdopen)
    with pytest.raises(Boom):
        write_atomic(path, "new and much longer\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["e.json"]


def test_save_failure_keeps_the_old_evidence(tmp_path, monkeypatch, prior_path):
    path = tmp_path / "e.json"
    evidence = schema.load(prior_path)
    schema.save(evidence, path)
    before = path.read_bytes()
    evidence.op = "changed"
    monkeypatch.setattr(schema.os, "fsync", _raise)
    with pytest.raises(Boom):
        schema.save(evidence, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["e.json"]


def test_tree_state_is_unknown_when_the_commit_is_named_for_another_checkout(monkeypatch):
    """A GPU machine given a copy of the tree: its own git state says nothing about ours."""
    from h3bench.harness import environment
    if environment.git(["rev-parse", "HEAD"], environment.REPO_ROOT) is None:
        pytest.skip("not a git checkout: the tree state is unknown anyway")
    monkeypatch.setenv("H3BENCH_COMMIT", "0" * 40)
    assert environment.tracked_tree_dirty() is None
    monkeypatch.delenv("H3BENCH_COMMIT")
    assert environment.tracked_tree_dirty() in (True, False)


def test_vendored_prior_art_is_the_recorded_copy():
    """tests/data holds the RFC's file byte for byte: its sha256 is the one tests/data/README.md records."""
    import hashlib
    import re
    readme = (require_prior_art().parent / "README.md").read_text()
    recorded = re.search(r"sha256 ([0-9a-f]{64})", readme)
    assert recorded, "tests/data/README.md names no sha256"
    assert hashlib.sha256(require_prior_art().read_bytes()).hexdigest() == recorded.group(1)


"""The command line: usage errors exit 2 with a message, validate exits 0/1, list shows every row,
and a tiny CPU run writes a valid file with a built-in and an external row."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from h3bench.harness import schema
from tests.helpers import composition, require_prior_art

WIDE = {"COLUMNS": "1000"}  # rich wraps at 80 columns when not writing to a terminal


def plain_composition(x, w, sh, sc, idx):
    """An external implementation passed as --adapter tests.test_cli:plain_composition."""
    return composition(x, w, sh, sc, idx)


def test_unknown_op(invoke, tmp_path):
    result, text = invoke("run", "--op", "no_such_op", "--device", "cpu", "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert "no_such_op" in text and "error" in text


def test_unknown_adapter(invoke, tmp_path):
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm,no_such_row",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert "unknown adapter(s) no_such_row" in text and "torch_rms_norm" in text  # the known ones listed


@pytest.mark.parametrize("setting,named", [
    ("no_such_key=3", "no_such_key"),
    ("hidden=abc", "hidden"),
    ("sweep.rows=[1]", "sweep.rows"),
    ("hidden", "hidden"),
    ("sweep.no_such_key=3", "no_such_key"),
    ("hidden=-8", "hidden"),
    ("sweep.max_failures=-1", "sweep.max_failures"),
    ("all_rows.batch_sizes=[5, -1]", "all_rows.batch_sizes"),
    ("all_rows.seeds=[3, true]", "all_rows.seeds"),
    # values of the right type that no probe can run: the config's error, not a failed row
    ("all_rows.batch_sizes=[0]", "batch_sizes"),
    ("full_vs_sub.spread=0", "spread"),
    ("full_vs_sub.sub_batch_sizes=[]", "sub_batch_sizes"),
    ("sweep.first_power=1", "first_power"),
    ("accuracy.rows=[]", "rows"),
    # messages are text, not rich markup: "[inputs]" is printed, not swallowed as a style tag
    ("hidden=0", "[inputs]: hidden must be >= 1, got 0"),
    ("timing.reps=0", "[timing]: "),
])
def test_bad_set(invoke, tmp_path, setting, named):
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", "--set", setting,
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert named in text and "error" in text
    assert not (tmp_path / "x.json").exists()


def test_missing_equals_sign_is_explained(invoke, tmp_path):
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", "--set", "hidden",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "key=value" in text


def test_out_under_a_regular_file(invoke, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm",
                          "--set", "hidden=16", "--no-render", "--quiet", "--out", str(blocker / "x.json"))
    assert result.exit_code == 2, text
    assert "--out" in text and "cannot write" in text
    assert blocker.read_text() == "not a folder"


def test_out_is_a_directory(invoke, tmp_path):
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm",
                          "--no-render", "--quiet", "--out", str(tmp_path))
    assert result.exit_code == 2, text
    assert "is a directory" in text


def test_out_with_a_trailing_slash_names_a_folder_not_a_file(invoke, tmp_path):
    """`--out runs/mine/` for one op: a folder was meant, and it does not exist yet. The slash is refused
    by name (Path() would drop it, and the run would write a file called `mine`)."""
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm",
                          "--no-render", "--quiet", "--out", str(tmp_path / "mine") + "/")
    assert result.exit_code == 2, text
    assert "names a folder" in text and "mine/norm_modulate.json" in text
    assert not (tmp_path / "mine").exists()


def test_no_adapters_selected(invoke, tmp_path):
    result, text = invoke("run", "--device", "cpu", "--adapters", "none", "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert "no adapters selected" in text


@pytest.mark.parametrize("spec,says", [
    ("tests.test_cli", "module:attr"),
    ("tests.no_such_module:f", "cannot import"),
    ("tests.test_cli:no_such_function", "no attribute"),
    ("tests.test_cli:WIDE", "neither an Adapter nor a callable"),
    ("tests.test_cli:two_arguments", "positional arguments"),
])
def test_bad_external_adapter(invoke, tmp_path, spec, says):
    result, text = invoke("run", "--device", "cpu", "--adapters", "none", "--adapter", spec,
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert says in text


def two_arguments(x, w):
    return x


def test_unknown_device_and_mode(invoke, tmp_path):
    result, text = invoke("run", "--device", "tpu", "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "--device" in text
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", "--mode", "fast",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "unknown mode(s) fast" in text


def test_validate_prior_art(invoke):
    path = require_prior_art()
    result, text = invoke("validate", str(path))
    assert result.exit_code == 0, text
    assert "valid" in text and "7 rows" in text


def test_validate_broken_files(invoke, tmp_path):
    data = json.loads(require_prior_art().read_text())
    del data["results"]["plain"]["rl_kernel"]["batch_invariance"]["batch_invariant"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result, text = invoke("validate", str(broken))
    assert result.exit_code == 1, text
    assert "invalid" in text and "$.results.plain.rl_kernel.batch_invariance" in text
    assert "batch_invariant" in text

    not_json = tmp_path / "not.json"
    not_json.write_text("{")
    result, text = invoke("validate", str(not_json))
    assert result.exit_code == 1 and "not JSON" in text

    result, text = invoke("validate", str(tmp_path / "missing.json"))   # bad input, not an invalid file
    assert result.exit_code == 2 and "no such file" in text


def test_a_folder_given_for_an_evidence_file_is_named_not_a_traceback(invoke, tmp_path):
    """validate, report and index read evidence files: a folder in a file's place is named as such
    (validate raised IsADirectoryError from json.load before)."""
    result, text = invoke("validate", str(tmp_path))
    assert result.exit_code == 2 and "a folder, not an evidence file" in text and "Traceback" not in text
    for command in ("report", "index"):
        result, text = invoke(command, str(tmp_path))
        assert result.exit_code != 0 and "a folder, not an evidence file" in text and "Traceback" not in text
    a_file = tmp_path / "a.md"   # and report's --out, a folder, given a file
    a_file.write_text("")
    result, text = invoke("report", str(require_prior_art()), "--out", str(a_file))
    assert result.exit_code != 0 and "is a file: the rendered files go into a folder" in text


def test_validate_names_a_file_whose_name_looks_like_markup(invoke, tmp_path):
    missing = tmp_path / "[run].json"
    result, text = invoke("validate", str(missing))
    assert result.exit_code == 2 and "[run].json: no such file" in text


def test_validate_one_bad_among_good_fails(invoke, tmp_path):
    good = require_prior_art()
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result, text = invoke("validate", str(good), str(bad))
    assert result.exit_code == 1
    assert "valid" in text and "invalid" in text


def test_list_shows_every_builtin_adapter(invoke):
    """Each row as `run` would judge it by default: available, unavailable, or skipped (a CPU runs the
    torch.compile rows only when named, and `list` says so instead of "available")."""
    from h3bench.adapters import builtin_adapters
    from h3bench.harness.adapter import as_default_row
    from h3bench.harness.schema import is_skip
    from h3bench.harness.config import load_config

    cpu = torch.device("cpu")
    result, _ = invoke("list", "--device", "cpu")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for adapter in builtin_adapters():
        params = load_config(adapter.op).inputs
        loaded = as_default_row(adapter, cpu).try_load(cpu, params)
        expected = ("available" if not isinstance(loaded, str) else "skipped" if is_skip(loaded) else "unavailable")
        row = [line for line in lines
               if re.search(rf"[│|]\s*{re.escape(adapter.op)}\s*[│|]\s*{re.escape(adapter.name)}\s*[│|]", line)]
        assert len(row) == 1, (adapter.key, result.output)
        status = re.findall(r"[│|]\s*(available|unavailable|skipped)\s*[│|]", row[0])
        assert status == [expected], (adapter.key, row[0])
    compiled = next(line for line in lines if re.search(r"norm_modulate\s*[│|]\s*torch_compile\s*[│|]", line))
    assert "skipped" in compiled and "Error" not in compiled
    # on a CPU the plain torch rows are available and the GPU libraries are not
    assert "available" in next(line for line in lines if " torch_rms_norm " in line)


def test_tiny_run_writes_a_valid_file(invoke, tmp_path):
    out = tmp_path / "tmp" / "x.json"
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm",
                          "--adapter", "tests.test_cli:plain_composition", "--set", "hidden=16",
                          "--no-render", "--quiet", "--out", str(out))
    assert result.exit_code == 0, text + repr(result.exception)
    evidence = schema.load(out)
    assert evidence.quick is True and evidence.config["inputs"]["hidden"] == 16
    rows = evidence.results["plain"]
    assert list(rows) == ["torch_rms_norm", "plain_composition"]
    for name, row in rows.items():
        assert isinstance(row, schema.RowResult), (name, row)
        assert row.batch_invariance.batch_invariant is True, name
    assert rows["plain_composition"].source == "tests.test_cli:plain_composition (external function, autograd)"
    assert set(rows["plain_composition"].accuracy_latency["17"].grad_rel_err) == {"x", "w", "sh", "sc"}
    assert set(rows["torch_rms_norm"].accuracy_latency["17"].grad_rel_err) == {"x", "w"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.json"]  # --no-render, no temp files


@pytest.mark.parametrize("flush", [False, True])
def test_flush_l2_reaches_the_timing_record_and_the_recorded_plan(invoke, tmp_path, flush):
    out = tmp_path / "x.json"
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm",
                          "--set", "hidden=16", *(["--flush-l2"] if flush else ["--no-graph-timing"]), "--no-render", "--quiet",
                          "--out", str(out))
    assert result.exit_code == 0, text + repr(result.exception)
    evidence = schema.load(out)
    record = evidence.environment.timing
    assert record.flush_l2 is flush and evidence.config["timing"]["flush_l2"] is flush
    assert record.flush_bytes == (256 << 20 if flush else None)
    assert (record.flush_applies_to is not None) is flush
    if flush:
        assert "synchronized" in record.flush_applies_to and "not the back-to-back" in record.flush_applies_to
    # graph timing is on in the shipped plans (--no-graph-timing: off); a CPU has no CUDA graphs and no
    # allocator counters: the record says why, the figures are absent
    assert evidence.config["timing"]["graph"] is flush and record.graph.startswith("none: ")
    assert ("cpu" in record.graph) if flush else ("--graph-timing" in record.graph)
    for size in evidence.results["plain"]["torch_rms_norm"].accuracy_latency.values():
        assert size.fwd_us > 0 and size.fwd_graph_us is None and size.graph_unavailable is None
        assert size.fwd_peak_bytes is None and size.fwd_bwd_net_peak_bytes is None


def test_entry_point_adapters_and_broken_ones(invoke, monkeypatch, tmp_path):
    """Rows registered by other packages (`h3bench.adapters` entry points) join the op's rows; one that does
    not import becomes its row's "unavailable" reason (the run goes on), and one whose name has no op is
    skipped with a warning instead of breaking every command."""
    from importlib.metadata import EntryPoint

    from h3bench.harness.commands import rows as registered

    group = registered.ENTRY_POINT_GROUP
    points = [EntryPoint("norm_modulate.ext_ok", "tests.test_cli:plain_composition", group),
              EntryPoint("norm_modulate.ext_broken", "no_such_package_xyz:fn", group),
              EntryPoint("bare_broken", "no_such_package_xyz:ADAPTER", group)]
    monkeypatch.setattr(registered.metadata, "entry_points",
                        lambda group=None: [p for p in points if p.group == group])
    monkeypatch.setattr(registered, "_WARNED", set())
    out = tmp_path / "x.json"
    result, text = invoke("run", "--device", "cpu", "--quick", "--set", "hidden=16", "--no-render",
                          "--adapters", "torch_rms_norm,ext_ok,ext_broken", "--out", str(out))
    assert result.exit_code == 0, text
    rows = schema.load(out).results["plain"]
    assert isinstance(rows["ext_ok"], schema.RowResult) and rows["ext_ok"].batch_invariance.batch_invariant
    assert isinstance(rows["ext_broken"], schema.UnavailableRow)
    assert "no_such_package_xyz" in rows["ext_broken"].unavailable and "ext_broken" in rows["ext_broken"].unavailable
    assert "warning" in text and "bare_broken" in text


def test_env_prints_the_environment_block(invoke):
    result, text = invoke("env", "--device", "cpu", "--no-bandwidth")
    assert result.exit_code == 0, text
    block = json.loads(result.stdout)
    assert block["torch"] == torch.__version__ and block["gpu"] is None
    assert block.get("copy_bandwidth_gbps") is None  # not measured when asked not to (absent: additive)
    assert "plain" in block["mode_environment"]


def test_several_ops_want_a_folder_not_a_json_path(invoke, tmp_path):
    result, text = invoke("run", "--op", "timestep_sinusoid,gate_residual", "--device", "cpu",
                          "--out", str(tmp_path / "both.json"))
    assert result.exit_code == 2 and "names a folder" in text
    assert not (tmp_path / "both.json").exists()


def test_default_out_paths_do_not_overwrite_a_run_of_the_same_second(monkeypatch, tmp_path):
    import datetime as real

    from h3bench.harness import runner

    class Frozen(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime(2026, 12, 5, 1, 2, 3)

    monkeypatch.setattr(runner.datetime, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    cpu = torch.device("cpu")
    first = runner.default_out_path("gate_residual", cpu, True)
    assert first == Path("runs/gate_residual_cpu_quick_20261205-010203.json")
    first.parent.mkdir()
    first.write_text("{}")
    second = runner.default_out_path("gate_residual", cpu, True)
    assert second == Path("runs/gate_residual_cpu_quick_20261205-010203-2.json")
    folder = runner.default_out_path("all", cpu, True).with_suffix("")  # --op all makes a folder of it
    folder.mkdir()
    assert runner.default_out_path("all", cpu, True) == Path("runs/all_cpu_quick_20261205-010203-2.json")


def test_version_and_short_help(invoke):
    from importlib import metadata
    try:
        version = metadata.version("h3bench")
    except metadata.PackageNotFoundError:  # the GPU machine: the checkout linked in, not installed
        version = "not installed"
    result, text = invoke("--version")
    assert result.exit_code == 0 and text == f"h3bench {version}", text
    result, text = invoke("-h")
    assert result.exit_code == 0 and "run" in text and "compare" in text, text
    result, text = invoke("run", "-h")
    assert result.exit_code == 0 and "--require-invariant" in text, text


@pytest.mark.parametrize("seconds", ["-1", "0"])
def test_mode_timeout_must_be_positive(invoke, tmp_path, seconds):
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", "--mode-timeout", seconds,
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "--mode-timeout" in text and "positive" in text, text


def test_ray_without_ray_is_one_line(invoke, tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", "--ray", "auto",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "pip install 'h3bench[ray]'" in text and "Traceback" not in result.output, text


def test_piped_output_is_never_cut(tmp_path):
    """Not a terminal (a pipe, a CI log) and COLUMNS=80: every row name and figure printed whole."""
    from typer.testing import CliRunner

    from h3bench.cli import app
    runner = CliRunner()
    listed = runner.invoke(app, ["list", "--device", "cpu"], env={"COLUMNS": "80"})
    assert listed.exit_code == 0 and "…" not in listed.output
    assert re.search(r"\bliger_rlk_gather\b", listed.output) and re.search(r"\btorch_rms_norm\b", listed.output)
    out = tmp_path / "x.json"
    ran = runner.invoke(app, ["run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm", "--no-render",
                              "--quiet", "--out", str(out)], env={"COLUMNS": "80"})
    assert ran.exit_code == 0 and "…" not in ran.output, ran.output
    # --quiet hides progress only: the summary (with its units) and the "wrote" line are there
    assert "torch_rms_norm" in ran.output and "fwd rel" in ran.output and f"wrote {out}" in ran.output


# --- the CLI a newcomer meets ------------------------------------------------------------------------------

SMALL = ("--device", "cpu", "--quick", "--set", "hidden=16", "--no-render")


@pytest.mark.parametrize("flags, named", [(("--quick", "--full"), "--quick and --full"),
                                          (("--gpus", "1", "--ray", "auto"), "--gpus and --ray")])
def test_mutually_exclusive_flags_are_one_line_errors(invoke, tmp_path, flags, named):
    out = tmp_path / "x.json"
    result, text = invoke("run", "--device", "cpu", "--adapters", "torch_rms_norm", *flags, "--out", str(out))
    assert result.exit_code == 2 and named in text and "exclude each other" in text, text
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory):
    """A small run whose output is not a terminal (CliRunner: a pipe), progress on: (output, file)."""
    from typer.testing import CliRunner

    from h3bench.cli import app
    out = tmp_path_factory.mktemp("piped") / "x.json"
    ran = CliRunner().invoke(app, ["run", *SMALL, "--adapters", "torch_rms_norm,torch_compile_max_autotune",
                                   "--out", str(out)], env=WIDE)
    assert ran.exit_code == 0, ran.output
    return ran.output, out


def test_off_a_terminal_each_finished_row_and_op_is_one_plain_line(piped_run):
    output, _ = piped_run
    lines = output.splitlines()
    assert any(re.fullmatch(r"norm_modulate plain/torch_rms_norm: invariant \(\d+\.\d s\)", line) for line in lines), output
    assert "norm_modulate plain/torch_compile_max_autotune: skipped (" in output
    assert any(re.fullmatch(r"norm_modulate: finished in \d+\.\d s", line) for line in lines), output
    # the row lines come before the summary (as the run goes), and no progress bar is drawn into the log
    assert output.index("plain/torch_rms_norm: invariant") < output.index("errors and latencies")
    assert "━" not in output
    summary = output[output.index("errors and latencies"):output.index("finished in")]
    assert max(len(line) for line in summary.splitlines()) <= 160, summary   # the reasons fold, not widen it


def test_a_plain_progress_line_is_written_when_it_happens():
    import io

    from rich.console import Console

    from h3bench.harness.progress import PlainObserver
    from h3bench.harness.schema import UnavailableRow

    class Sink(io.StringIO):
        flushed = ""

        def flush(self):
            self.flushed = self.getvalue()

    sink = Sink()
    observer = PlainObserver(Console(file=sink, width=200), "gate_residual")
    observer.row_started("plain", "mine", {})
    observer.row_finished("plain", "mine", UnavailableRow(unavailable="ImportError: x", wall_s=0.25))
    assert sink.flushed == "gate_residual plain/mine: unavailable (0.2 s)\n"
    observer.row_started("plain", "ours", {})
    observer.row_started("plain", "theirs", {})   # ours's probes ended: said before its verdict comes
    assert sink.flushed.endswith("\ngate_residual plain/ours: probes done (0.0 s)\n")
    observer.phase_started("plain", "latency, rows interleaved", 10)
    assert sink.flushed.endswith("\ngate_residual plain/theirs: probes done (0.0 s)\n")
    observer.phase_finished()
    assert "gate_residual plain: latency, rows interleaved: done (" in sink.flushed.splitlines()[-1]


def test_quiet_hides_the_progress_lines(invoke, tmp_path):
    result, text = invoke("run", *SMALL, "--adapters", "torch_rms_norm", "--quiet", "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 0, text
    assert "plain/torch_rms_norm: invariant" not in text and "finished in" in text


def test_the_summary_fits_120_columns_names_whole_and_says_what_its_numbers_are(piped_run):
    from rich.console import Console

    from h3bench.harness.progress import summary_table

    evidence = schema.load(piped_run[1])
    console = Console(width=120, record=True)
    console.print(summary_table(evidence))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 120
    for name in ("torch_rms_norm", "torch_compile_max_autotune"):   # never broken mid-word
        assert re.search(rf"^\s*{name}\s", text, re.M), text
    flat = " ".join(text.split())
    assert "rows" in flat.split("─")[0]            # the batch size in the title is a number of rows
    assert "floor" not in flat                       # a CPU has no memory floor worth a column
    assert "host wall clock, 1 sample per figure" in flat
    assert "skipped (-): torch_compile_max_autotune: skipped on CPU" in flat and "RuntimeError" not in flat


def test_piped_list_stays_within_160_columns_and_list_op_gives_the_whole_source(invoke):
    from typer.testing import CliRunner

    from h3bench.cli import app
    listed = CliRunner().invoke(app, ["list", "--device", "cpu"], env=WIDE)
    assert listed.exit_code == 0
    assert max(len(line) for line in listed.output.splitlines()) <= 160, listed.output
    one, text = invoke("list", "--device", "cpu", "--op", "timestep_sinusoid")
    assert one.exit_code == 0 and "sources of the available rows:" in text
    assert "formula" not in text and "out = [cos(t * f), sin(t * f)]" in text


def test_a_compiled_rows_brief_source_leaves_the_settings_to_the_file():
    from h3bench.adapters import builtin_adapters
    from tests.helpers import nm_params

    row = next(a for a in builtin_adapters("norm_modulate") if a.name == "torch_compile")
    loaded = row.try_load(torch.device("cpu"), nm_params())
    if isinstance(loaded, str):
        pytest.skip(f"torch_compile does not load here: {loaded}")
    assert "inductor:" in loaded.source and "inductor:" not in loaded.short_source
    assert len(loaded.short_source) < 120 and "diffusers row" in loaded.short_source


def test_help_shows_tables_defaults_and_no_bool_type(invoke):
    result, text = invoke("run", "-h")
    assert result.exit_code == 0, text
    assert "(sets [timing] flush_l2)" in text and "sets [timing] graph" in text and "[name=]module:attr" in text
    for option in ("--out", "--adapters", "--mode-timeout", "--graph-timing"):
        assert re.search(rf"{option} .*?\[default: ", text), option
    options = [line for line in result.output.splitlines() if "--" in line and "--help" not in line]
    assert options and not any("<bool>" in line for line in options), result.output
    assert "--force" in text and "--no-graph-timing" in text


def test_graph_timing_is_on_in_the_shipped_plans():
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import OP_MODULES

    for op in OP_MODULES:
        assert load_config(op).timing.graph is True and load_config(op, quick=True).timing.graph is True, op


def test_bad_input_exits_2_in_every_command(invoke, tmp_path):
    missing = tmp_path / "missing.json"
    for args in (("report", str(missing)), ("compare", str(missing), str(missing)), ("index", str(missing)),
                 ("merge", str(missing), str(missing), "-o", str(tmp_path / "m.json")), ("validate", str(missing))):
        result, text = invoke(*args)
        assert result.exit_code == 2 and "missing.json" in text and "Traceback" not in text, (args, text)


def test_run_refuses_to_overwrite_a_named_file_without_force(invoke, tmp_path):
    out = tmp_path / "x.json"
    out.write_text("{}")
    result, text = invoke("run", *SMALL, "--adapters", "torch_rms_norm", "--quiet", "--out", str(out))
    assert result.exit_code == 2 and "--force" in text and out.read_text() == "{}", text
    result, text = invoke("run", *SMALL, "--adapters", "torch_rms_norm", "--quiet", "--force", "--out", str(out))
    assert result.exit_code == 0, text
    assert schema.load(out).op == "norm_modulate"


def test_report_and_compare_refuse_to_overwrite_named_files_without_force(invoke, tmp_path):
    prior = require_prior_art()
    folder = tmp_path / "rendered"
    assert invoke("report", str(prior), "--out", str(folder), "--quiet")[0].exit_code == 0
    rendered = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    result, text = invoke("report", str(prior), "--out", str(folder), "--quiet")
    assert result.exit_code == 2 and "--force" in text, text
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == rendered
    assert invoke("report", str(prior), "--out", str(folder), "--quiet", "--force")[0].exit_code == 0
    note = tmp_path / "note.md"
    note.write_text("mine")
    result, text = invoke("compare", str(prior), str(prior), "--markdown", str(note))
    assert result.exit_code == 2 and "--force" in text and note.read_text() == "mine", text
    result, text = invoke("compare", str(prior), str(prior), "--markdown", str(note), "--force")
    assert result.exit_code == 0 and note.read_text() != "mine", text


def test_the_readme_synopsis_names_every_option_of_run():
    """README.md's `h3bench run` synopsis is the program's: every option `run --help` shows is in it."""
    import typer.main

    from h3bench.cli import app
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    synopsis = readme[readme.index("    h3bench run ["):readme.index("    h3bench list [")]
    command = typer.main.get_command(app).commands["run"]
    options = [opt for p in command.params if not getattr(p, "hidden", False) for opt in (*p.opts, *p.secondary_opts)
               if opt.startswith("--") and opt != "--help" and opt != "--render"]   # --no-render: the non-default
    assert options and [o for o in options if o not in synopsis] == []


def test_a_summary_of_several_modes_names_each_row_whole_at_120_columns():
    """`mode/row` labels, a mode-tagged row (`diffusers[vllm]`) included: never broken, never eaten as markup."""
    import copy

    from rich.console import Console

    from h3bench.harness.progress import summary_table

    evidence = schema.load(require_prior_art())
    plain = evidence.results["plain"]
    evidence.results["vllm"] = {"diffusers[vllm]": copy.deepcopy(plain["diffusers"]),
                                "torch_compile_max_autotune": copy.deepcopy(plain["rl_kernel"])}
    console = Console(width=120, record=True)
    console.print(summary_table(evidence))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 120
    for label in ("plain/diffusers", "vllm/diffusers", "vllm/torch_compile_max_autotune", "plain/rl_kernel"):
        assert re.search(rf"^\s*{re.escape(label)}\s", text, re.M), (label, text)


def test_piped_prose_folds_within_160_columns_and_never_cuts_a_path(tmp_path):
    """The header line and the `wrote` line of a piped run fold at PIPED_TABLE_WIDTH between words, each path
    whole on one line (a path with a space, and one longer than the width, included)."""
    from typer.testing import CliRunner

    from h3bench.cli import app
    from h3bench.harness.console import PIPED_TABLE_WIDTH
    out = tmp_path / ("a_long_folder_name_" * 8) / "with space" / "x.json"
    rendered = [a for a in SMALL if a != "--no-render"]
    ran = CliRunner().invoke(app, ["run", *rendered, "--adapters", "torch_rms_norm", "--quiet", "--out", str(out)],
                             env={"COLUMNS": "80"})
    assert ran.exit_code == 0, ran.output
    lines = ran.output.splitlines()
    written = lines[next(i for i, line in enumerate(lines) if line.split(" ")[0] == "wrote"):]
    assert written[0] == "wrote"   # each path longer than the line: on its own
    paths = [line.strip().rstrip(",") for line in written[1:]]
    assert paths == [str(p) for p in (out, *(out.parent / f"x{s}" for s in (".md", ".html", "_latency.png",
                                                                             "_accuracy.png", "_verdicts.png")))]
    assert lines[0].startswith("h3bench: op norm_modulate, device cpu, plan quick (--quick), modes plain")
    assert len(lines[0]) <= PIPED_TABLE_WIDTH


def test_fold_breaks_between_words_only():
    from h3bench.harness.console import fold

    path = "/tmp/a folder/with spaces/evidence.json"
    text = fold(f"wrote {path}, /x/{'y' * 50}.json", 30, whole=[path])
    assert text.splitlines() == ["wrote", f"  {path},", f"  /x/{'y' * 50}.json"]


def test_validate_names_a_cpu_files_device_not_a_missing_gpu(invoke, piped_run):
    result, text = invoke("validate", str(piped_run[1]))
    assert result.exit_code == 0, text
    assert "gpu None" not in text and re.search(r"valid \(norm_modulate, 2 rows, device cpu", text), text

"""A user's own op on the command line (`--op PATH.py:ATTR`, `module:ATTR`, an `h3bench.ops` entry point):
docs/examples/rms_norm_op.py runs end to end through the quick plan on the CPU; planted faults in its rows
are caught by `--require-invariant` and an honest row passes; rows that break its contract get a one-line
reason; every bad declaration is one line and exit 2."""
from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from h3bench.harness import op_source, ops, schema, semantics
from h3bench.harness.ops import Input, UserOp
from h3bench.harness.ops.declared import DeclaredOp, UserOpError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'docs' / 'examples' / 'rms_norm_op.py'}:RMS_NORM"
IMPL = f"{ROOT / 'docs' / 'examples' / 'rms_norm_impl.py'}:rms_norm"
ROWS = ROOT / "tests" / "user_op_rows.py"
FAULTS = ("split_reduction_from_256", "odd_batch_tail", "row_position", "weight_grad_by_atomics")
BROKEN = {"wrong_shape": "contract: output 'y' has shape", "wrong_dtype": "contract: output 'y' has dtype",
          "wrong_device": "contract: output 'y' has device", "raises": "RuntimeError: kernel launch failed",
          "not_a_tensor": "implementation returned list"}


@pytest.fixture(autouse=True)
def declared_ops_restored():
    """Resolving a user op registers it in this process: leave the registry as it was."""
    saved, sources = dict(ops.DECLARED), dict(ops.DECLARED_SOURCES)
    yield
    ops.DECLARED.clear(), ops.DECLARED.update(saved)
    ops.DECLARED_SOURCES.clear(), ops.DECLARED_SOURCES.update(sources)


def one_error_line(result, text: str) -> str:
    assert result.exit_code == 2, text + repr(result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return text


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """The example op with its plain-torch row through the quick plan, rendered, gated on that row."""
    from typer.testing import CliRunner

    from h3bench.cli import app

    out = tmp_path_factory.mktemp("example") / "example.json"
    saved, sources = dict(ops.DECLARED), dict(ops.DECLARED_SOURCES)
    result = CliRunner().invoke(app, ["run", "--op", EXAMPLE, "--adapter", IMPL, "--device", "cpu", "--quick",
                                      "--require-invariant", "rms_norm", "--out", str(out)],
                                env={"COLUMNS": "1000"})
    ops.DECLARED.clear(), ops.DECLARED.update(saved)
    ops.DECLARED_SOURCES.clear(), ops.DECLARED_SOURCES.update(sources)
    return result, out


def test_the_example_op_runs_end_to_end_and_its_honest_row_passes_the_gate(example_run):
    result, out = example_run
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "required invariance: every selected row is batch-invariant" in result.output
    evidence = schema.load(out)
    assert evidence.op == "example_rms_norm" and evidence.quick is True
    assert evidence.config["inputs"] == {"hidden": 64, "eps": 1e-6, "dtype": "bfloat16"}  # the declared defaults
    assert evidence.config["plans"] == "quick"
    row = evidence.results["plain"]["rms_norm"]
    assert isinstance(row, schema.RowResult), row
    assert row.batch_invariance.batch_invariant is True and row.batch_invariance.params_repeatable is True
    for size in row.accuracy_latency.values():
        # against the float64 reference: one bf16 rounding of the output, gradients for both inputs
        assert 0 < size.fwd_rel_err < 2 ** -7
        assert set(size.grad_rel_err) == {"x", "weight"} and max(size.grad_rel_err.values()) < 2 ** -6
        assert size.fwd_us > 0 and size.fwd_bwd_us > 0
        assert size.fwd_floor_model_us is not None  # the op declares its traffic
    for suffix in (".md", ".html"):
        assert "example_rms_norm" in out.with_suffix(suffix).read_text()


def test_the_control_is_planted_in_the_reference_in_the_inputs_dtype_and_flagged(example_run):
    result, out = example_run
    control = schema.load(out).control
    assert isinstance(control, schema.ControlResult), control
    assert control.flagged is True and control.row_grads == ["x"]
    assert "reference in the inputs' dtype" in control.source
    # the progress line names what the fault is planted in: the op's own reference, no built-in op's row
    assert ("example_rms_norm plain: control: the op's reference in the inputs' dtype with a planted batch-size "
            "fault: done") in result.output


def test_the_file_validates_with_the_op_named(invoke, example_run):
    _, out = example_run
    result, text = invoke("validate", str(out))
    assert result.exit_code == 1 and "--op PATH.py:ATTR" in text
    result, text = invoke("validate", "--op", EXAMPLE, str(out))
    assert result.exit_code == 0 and "valid (example_rms_norm" in text, text
    assert semantics.problems(schema.load(out)) == []


def test_list_prints_the_user_ops_signature(invoke):
    result, text = invoke("list", "--device", "cpu", "--op", EXAMPLE)
    assert result.exit_code == 0, text
    assert "def my_example_rms_norm(x, weight, *, hidden=64, eps=1e-06, dtype='bfloat16'): # -> y" in text
    assert "y [2, 64] bfloat16" in text


def test_planted_faults_in_the_rows_are_caught_and_broken_rows_get_their_reason(invoke, tmp_path):
    out = tmp_path / "faults.json"
    rows = [f"{ROWS}:{name}" for name in ("honest", *FAULTS, *BROKEN)]
    result, text = invoke("run", "--op", EXAMPLE, *[a for r in rows for a in ("--adapter", r)], "--device", "cpu",
                          "--quick", "--quiet", "--no-render", "--no-control", "--set", "hidden=32",
                          "--require-invariant", ",".join(("honest", *FAULTS)), "--out", str(out))
    assert result.exit_code == 1, text + repr(result.exception)
    failed = [line for line in result.output.splitlines() if line.startswith("required invariance failed:")]
    assert sorted(line.split("example_rms_norm/")[1].split(" ")[0] for line in failed) == sorted(FAULTS)
    evidence = schema.load(out)
    assert evidence.config["inputs"]["hidden"] == 32
    found = evidence.results["plain"]
    assert found["honest"].batch_invariance.batch_invariant is True
    bi = {name: found[name].batch_invariance for name in FAULTS}
    assert bi["split_reduction_from_256"].full_vs_sub_batches.fwd_differ > 0
    assert bi["split_reduction_from_256"].batch_size_sweep.differ > 0
    assert all(c.fwd_differ == 0 for c in bi["split_reduction_from_256"].all_rows.values())  # below 256 rows
    assert sum(c.fwd_differ for c in bi["odd_batch_tail"].all_rows.values()) > 0
    assert sum(c.fwd_differ for c in bi["row_position"].all_rows.values()) > 0
    assert bi["weight_grad_by_atomics"].params_repeatable is False
    atomics = bi["weight_grad_by_atomics"]  # its rows are fine: only the weight gradient's sum order moves
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in atomics.all_rows.values())
    assert (atomics.full_vs_sub_batches.fwd_differ, atomics.batch_size_sweep.differ) == (0, 0)
    for name, reason in BROKEN.items():
        row = found[name]
        assert isinstance(row, schema.UnavailableRow), (name, row)
        assert reason in row.unavailable and "\n" not in row.unavailable, (name, row.unavailable)


def test_the_module_form_and_the_entry_point_group_resolve_the_same_declaration(invoke, monkeypatch):
    from docs.examples.rms_norm_op import RMS_NORM

    monkeypatch.chdir(ROOT)
    result, text = invoke("list", "--device", "cpu", "--op", "docs.examples.rms_norm_op:RMS_NORM")
    assert result.exit_code == 0 and "def my_example_rms_norm(x, weight" in text, text
    ops.DECLARED.clear(), ops.DECLARED_SOURCES.clear()
    point = EntryPoint("example_rms_norm", "docs.examples.rms_norm_op:RMS_NORM", op_source.ENTRY_POINT_GROUP)
    monkeypatch.setattr(op_source.metadata, "entry_points",
                        lambda group=None: [point] if group == op_source.ENTRY_POINT_GROUP else [])
    op = op_source.resolve("example_rms_norm")
    assert isinstance(op, DeclaredOp) and op.declaration is RMS_NORM
    assert op_source.spec_of("example_rms_norm") == "example_rms_norm"  # a mode's child finds it the same way


def test_all_stays_the_builtin_ops(invoke):
    op_source.resolve(EXAMPLE)
    assert "example_rms_norm" not in ops.OP_MODULES and ops.known("example_rms_norm")


# --- bad input: one line, exit 2 ---------------------------------------------------------------------------

OP_FILE = '''
import torch
from h3bench.harness.ops import Input, UserOp

def make_inputs(params, rows, seed, device):
    gen = torch.Generator().manual_seed(seed)
    return {{"x": torch.randn(rows, params.width, generator=gen).to(device)}}

def reference(x):
    return x * 2

{changes}
'''


def op_file(tmp_path, changes: str, attr: str = "OP") -> str:
    path = tmp_path / "my_op.py"
    path.write_text(OP_FILE.format(changes=changes))
    return f"{path}:{attr}"


GOOD = 'OP = UserOp(name="twice", inputs=(Input("x", per_row=True, differentiable=True),), outputs=("y",), ' \
       'constants={{"width": 8}}, make_inputs=make_inputs, reference=reference{extra})'


@pytest.mark.parametrize("command", ["run", "list"])
@pytest.mark.parametrize("case, says", [
    ("missing_file", "no such file"),
    ("missing_attribute", "has no attribute 'NOPE' (op declarations there: OP)"),
    ("a_function", "is a function (make_inputs), not an op declaration"),
    ("a_dict", "is a dict ({'name': 'x'}), not an op declaration"),
    ("no_per_row_input", "is inconsistent: no input is per_row"),
    ("constant_not_toml", "is inconsistent: constant 'shape' has default (1, 2) (tuple)"),
    ("import_raises", "importing"),
    ("make_inputs_raises", "op twice ("),
    ("reference_raises", "reference raised ZeroDivisionError: division by zero"),
    ("builtin_name", "a built-in op's name"),
])
def test_bad_op_declarations_are_one_line_and_exit_2(invoke, tmp_path, command, case, says):
    good = GOOD.format(extra="")
    spec = {
        "missing_file": lambda: f"{tmp_path / 'nope.py'}:OP",
        "missing_attribute": lambda: op_file(tmp_path, good, "NOPE"),
        "a_function": lambda: op_file(tmp_path, good, "make_inputs"),
        "a_dict": lambda: op_file(tmp_path, 'OP = {"name": "x"}'),
        "no_per_row_input": lambda: op_file(tmp_path, good.replace("per_row=True", "per_row=False")),
        "constant_not_toml": lambda: op_file(tmp_path, good.replace('{"width": 8}', '{"width": 8, "shape": (1, 2)}')),
        "import_raises": lambda: op_file(tmp_path, "raise ImportError('needs a GPU library')\n" + good),
        "make_inputs_raises": lambda: op_file(tmp_path, good.replace('"width": 8', '"width": -1')),
        "reference_raises": lambda: op_file(tmp_path, "def reference(x):\n    return 1 / 0\n" + good),
        "builtin_name": lambda: op_file(tmp_path, good.replace('"twice"', '"norm_modulate"')),
    }[case]()
    args = ("run", "--op", spec, "--device", "cpu", "--quick", "--adapters", "none", "--adapter", IMPL,
            "--out", str(tmp_path / "x.json")) if command == "run" else ("list", "--device", "cpu", "--op", spec)
    result, text = invoke(*args)
    one_error_line(result, text)
    assert says in text, text
    if case == "make_inputs_raises":
        assert "make_inputs raised RuntimeError" in text
    assert not (tmp_path / "x.json").exists()  # nothing half-written


def test_an_op_without_traffic_has_no_floors_and_says_so(invoke, tmp_path):
    spec = op_file(tmp_path, GOOD.format(extra=""))
    out = tmp_path / "twice.json"
    result, text = invoke("run", "--op", spec, "--adapter", spec.replace(":OP", ":reference"), "--device", "cpu",
                          "--quick", "--quiet", "--no-render", "--out", str(out))
    assert result.exit_code == 0, text + repr(result.exception)
    evidence = schema.load(out)
    assert evidence.environment.floor_model.startswith("none: the op declares no floor_traffic")
    row = evidence.results["plain"]["reference"]
    assert all(size.fwd_floor_model_us is None and size.fwd_floor_fraction is None
               for size in row.accuracy_latency.values())
    assert evidence.control.flagged is True


def test_a_declared_composition_is_the_controls():
    def composition(x):
        return x * 2

    decl = UserOp(name="twice", inputs=(Input("x", per_row=True, differentiable=True),), outputs=("y",),
                  constants={}, make_inputs=lambda p, r, s, d: {}, reference=composition, composition=composition)
    fn, what = DeclaredOp(decl, "here").control_composition()
    assert fn is composition and "composition" in what


def test_an_inconsistent_declaration_names_every_problem():
    decl = UserOp(name="a b", inputs=(Input("x"), Input("x")), outputs=(), constants={"x": None},
                  make_inputs=None, reference=None)
    with pytest.raises(UserOpError) as found:
        DeclaredOp(decl, "here")
    message = str(found.value)
    for phrase in ("name 'a b'", "declared twice", "no input is per_row", "outputs must be", "has an input's name",
                   "make_inputs must be a function", "reference must be a function"):
        assert phrase in message, (phrase, message)

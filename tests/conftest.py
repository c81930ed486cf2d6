"""Tests run on the CPU; Triton kernels run under its interpreter, which must be switched on before
triton is first imported. H3BENCH_TEST_DEVICE=cuda runs the device-parametrised tests on a GPU.

Every test must leave the process as it found it, so that the whole suite runs in one pytest process on
either device (`.ci/gpu-nightly` runs it so): `_leaves_the_process_as_found` compares the environment,
the interpreter's and triton's launch hooks, and torch's global switches before and after each test and
fails the test that changed one; `pytest_collection_finish` does the same for what importing the test
modules did (a tool that sets TRITON_INTERPRET at import switched the interpreter on for every GPU test
collected after it)."""
import os

DEVICE = os.environ.get("H3BENCH_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
_ENVIRONMENT_AT_START = dict(os.environ)

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Importing the kernels under the interpreter installs their fixed-order tl.dot once for the process
# (kernels/interpreted_dot.py): done here, before any test, so that no test is counted as having changed
# the interpreter (the first test to import a kernel was, in some orders: `pytest tests/test_cli.py` after
# a file that imports none).
import h3bench.kernels.common  # noqa: E402,F401


# Variables a library sets for itself and keeps: pytest's current test, the cache folder torch's
# inductor writes into the environment the first time it looks it up (importing diffusers does that), and
# the address inductor's C++ backend hands each compiled module as it loads it (set again before every load),
# and the Triton cache folder and ptxas that inductor points Triton at the first time it compiles for a GPU
# (seen on an H100 with torch 2.11: a torch.compile row sets both and keeps them), and the OpenMP switches
# that importing Liger's ops sets on the GPU machine (liger-kernel 0.8.5 with torch 2.11: a fresh
# interpreter's `import liger_kernel.ops.rms_norm` adds KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK), the
# CUDA header folder Transformer Engine finds for its NVRTC kernels (transformer_engine/common/__init__.py
# of 2.20.2 sets NVTE_CUDA_INCLUDE_DIR on import when it is unset), and the two that importing jax sets
# (TF_CPP_MIN_LOG_LEVEL, TPU_SKIP_MDS_QUERY): on the GPU image, with TE installed, peft imported
# transformer_engine.pytorch on its own (peft/import_utils.py, is_te_pytorch_available) in the rms_norm test,
# after Liger's row had loaded and before the TE row's import could keep TE's JAX half out, and TE's
# __init__ then imported jax (linear's test, with no Liger row, imported TE through its row, without jax).
LIBRARY_OWN = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
                         "TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
                         "NVTE_CUDA_INCLUDE_DIR", "TF_CPP_MIN_LOG_LEVEL", "TPU_SKIP_MDS_QUERY"})


def _process_state() -> dict:
    """What a test must not leave changed: a name per item, each with a value compared by == (functions by
    identity)."""
    state = {"os.environ": {k: v for k, v in os.environ.items() if k not in LIBRARY_OWN},
             "torch.get_num_threads()": torch.get_num_threads(),
             "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
             "torch.get_default_dtype()": torch.get_default_dtype(),
             "torch.is_grad_enabled()": torch.is_grad_enabled()}
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None:  # imported by triton itself: patched functions and classes show here
        for owner in ("InterpreterBuilder", "GridExecutor"):
            cls = getattr(interpreter, owner, None)
            if cls is not None:
                state[f"interpreter.{owner}"] = {k: v for k, v in vars(cls).items() if callable(v)}
        state["interpreter"] = {k: v for k, v in vars(interpreter).items()
                                if callable(v) and not isinstance(v, type(sys))}
    modes = sys.modules.get("h3bench.harness.modes")
    if modes is not None:  # a mode a test registers (tests/fake_modes.py) is its own
        state["registered modes"] = tuple(modes.MODES)
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    if knobs is not None:
        runtime = knobs.runtime
        state["triton.knobs.runtime hooks"] = tuple(
            (getattr(h, "calls", None) and list(h.calls)) if h is not None else None
            for h in (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None)))
    return state


def _changes(before: dict, after: dict) -> list[str]:
    found = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            keys = sorted(k for k in set(old) | set(new) if old.get(k, ...) != new.get(k, ...))
            found.append(f"{name}: {', '.join(map(str, keys))}")
        elif name in before:  # a module imported during the test is no change of what was there
            found.append(f"{name}: {old!r} -> {new!r}")
    return found


@pytest.fixture(autouse=True)
def _leaves_the_process_as_found():
    before = _process_state()
    yield
    changed = _changes(before, _process_state())
    assert not changed, "this test left the process changed for the tests after it: " + "; ".join(changed)


def pytest_collection_finish(session):
    changed = _changes({"os.environ": _ENVIRONMENT_AT_START}, {"os.environ": dict(os.environ)})
    if changed:
        raise pytest.UsageError("importing the test modules changed the process for every test: "
                                + "; ".join(changed))


# Under H3BENCH_TEST_DEVICE=cuda the suite runs what exercises the GPU: the device-parametrised tests (they
# take the `device` fixture) and those marked `gpu` (needs_cuda in tests/helpers.py). The rest hold no CUDA work:
# their behaviour does not depend on the device, and CI runs them on the CPU. H3BENCH_TEST_ALL=1 keeps every
# test (the whole suite on a GPU machine).
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: exercises a CUDA device; selected by the GPU suite")


def exercises_gpu(item) -> bool:
    return "device" in getattr(item, "fixturenames", ()) or item.get_closest_marker("gpu") is not None


def pytest_collection_modifyitems(config, items):
    if DEVICE != "cuda" or os.environ.get("H3BENCH_TEST_ALL") == "1":
        return
    kept, dropped = [], []
    for item in items:
        (kept if exercises_gpu(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def device() -> torch.device:
    return torch.device(DEVICE)


@pytest.fixture
def invoke():
    """Run the `h3bench` program (h3bench.cli: every command) in this process; returns (result, text)."""
    from typer.testing import CliRunner

    from h3bench.cli import app

    runner = CliRunner()

    def call(*args: str):
        result = runner.invoke(app, list(args), env={"COLUMNS": "1000"})
        return result, " ".join(result.output.split())
    return call


@pytest.fixture
def fake_modes(monkeypatch):
    """The planted modes of tests/fake_modes.py registered for one test (and its children, through the
    variable), taken out again after it."""
    from h3bench.harness import modes

    monkeypatch.setenv(modes.MODULES_VARIABLE, "tests.fake_modes")
    modes.register_modules(["tests.fake_modes"])
    yield
    for spec in __import__("tests.fake_modes", fromlist=["MODES"]).MODES:
        modes.MODES.pop(spec.name, None)

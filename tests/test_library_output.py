"""harness/library_output.py: what a library prints to stderr while diverted goes to the run's log file,
not the console; without a log nothing is diverted; the compile hooks divert each compilation."""
from __future__ import annotations

import logging
import sys

from h3bench.harness import library_output


def test_diverted_stderr_lands_in_the_log_with_its_label(tmp_path, capsys):
    log = tmp_path / "run.library.log"
    with library_output.kept_in(log):
        with library_output.diverted("torch.compile compiling"):
            sys.stderr.write("AUTOTUNE mm(64x64, 64x64)\n")
        sys.stderr.write("a line of our own\n")
    assert log.read_text() == "--- torch.compile compiling\nAUTOTUNE mm(64x64, 64x64)\n"
    assert capsys.readouterr().err == "a line of our own\n"


def test_no_log_no_file_and_nothing_diverted(tmp_path, capsys):
    log = tmp_path / "run.library.log"
    with library_output.kept_in(log):
        sys.stderr.write("ours\n")
    assert not log.exists()
    with library_output.diverted("x"):
        sys.stderr.write("library without a log\n")
    assert capsys.readouterr().err == "ours\nlibrary without a log\n"


def test_stderr_is_restored_when_the_diverted_block_raises(tmp_path):
    before = sys.stderr
    with library_output.kept_in(tmp_path / "x.log"):
        try:
            with library_output.diverted("x"):
                raise KeyError("boom")
        except KeyError:
            pass
    assert sys.stderr is before


def test_the_compile_hooks_divert_each_compilation(tmp_path):
    from h3bench.adapters import _torch_compile as tc

    hooks = tc._Hooks()
    hooks.current = tc._RowCompile(tc.MAX_AUTOTUNE, budget_s=None)
    log = tmp_path / "x.library.log"
    before = sys.stderr
    with library_output.kept_in(log):
        hooks._on_start(None)
        sys.stderr.write("AUTOTUNE addmm\n")
        hooks._on_end(None)
    assert sys.stderr is before
    assert "AUTOTUNE addmm" in log.read_text()
    assert hooks.current.tally.compiles == 1


def test_a_stretch_that_printed_nothing_leaves_no_label(tmp_path):
    log = tmp_path / "run.library.log"
    with library_output.kept_in(log):
        with library_output.diverted("quiet compile"):
            pass
        with library_output.diverted("talking compile"):
            sys.stderr.write("AUTOTUNE\n")
    assert log.read_text() == "--- talking compile\nAUTOTUNE\n"


def test_a_logging_handler_bound_to_stderr_writes_to_the_log_while_diverted(tmp_path):
    """torch's loggers hold the stderr of their making: Inductor's failed-choice tracebacks came through."""
    logger = logging.getLogger("h3bench.tests.library_output")
    handler = logging.StreamHandler()  # bound to the stderr of now
    logger.addHandler(handler)
    try:
        log = tmp_path / "run.library.log"
        with library_output.kept_in(log):
            with library_output.diverted("compile"):
                logger.error("Triton compilation failed")
        assert handler.stream is sys.stderr  # bound back
        assert log.read_text() == "--- compile\nTriton compilation failed\n"
    finally:
        logger.removeHandler(handler)

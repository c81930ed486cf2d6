"""Inductor's caches in a folder that outlasts the run (harness/compile_cache.py): the user's own setting kept,
else H3BENCH_CACHE_DIR, XDG_CACHE_HOME or ~/.cache, never the temporary directory a reboot empties."""
from __future__ import annotations

from pathlib import Path

from h3bench.harness import compile_cache


def test_the_users_own_folder_is_kept():
    environ = {"TORCHINDUCTOR_CACHE_DIR": "/somewhere/mine", "H3BENCH_CACHE_DIR": "/other"}
    assert compile_cache.keep_inductor_caches(environ) == "/somewhere/mine"
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/mine"


def test_a_folder_that_outlasts_the_run_in_order_of_the_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    environ = {"H3BENCH_CACHE_DIR": str(tmp_path / "h3"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert compile_cache.keep_inductor_caches(environ) == str(tmp_path / "h3" / "inductor")
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert compile_cache.keep_inductor_caches(environ) == str(tmp_path / "xdg" / "h3bench" / "inductor")
    environ = {}
    found = compile_cache.keep_inductor_caches(environ)
    assert found == str(Path(tmp_path / "home") / ".cache" / "h3bench" / "inductor")
    assert environ == {"TORCHINDUCTOR_CACHE_DIR": found}

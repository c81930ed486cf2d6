"""Kernels whose programs depend on each other, run under the interpreter with a launch's programs at once
(tests/concurrent_grid.py): first the executor itself (thread-local program ids, programs resident at most
`workers` at a time, a wait that cannot end reported as a hang), then the GEMMs' split-K (the last chunk to
arrive adds them all: in chunk order whoever it is), then norm_modulate's split backward with its c exchanged
between a range's column blocks (kernels/NOTES.md v41-v43), which the interpreter's own loop can only run as
"recompute". The GPU tests check the memory ordering, which this cannot."""
import contextlib
import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from tests.concurrent_grid import ProgramsHung, concurrent_programs


@triton.jit
def _ids_kernel(OUT, SPIN):
    pid = tl.program_id(0)
    for _ in range(3):   # atomics between the id's read and its use: the other threads run meanwhile
        tl.atomic_add(SPIN, 1)
    tl.store(OUT + pid, pid + 1)


@triton.jit
def _barrier_kernel(COUNT, OUT):
    """Every program counts itself in, then waits until all have: ends only if all are resident at once."""
    tl.atomic_add(COUNT, 1, sem="release")
    seen = tl.atomic_add(COUNT, 0, sem="acquire")
    while seen < tl.num_programs(0):
        seen = tl.atomic_add(COUNT, 0, sem="acquire")
    tl.store(OUT + tl.program_id(0), seen)


def _cpu_only():
    from tests.conftest import DEVICE
    if DEVICE != "cpu":
        pytest.skip("the interpreter's executor: a CPU test (the GPU runs these kernels' programs at once itself)")


def test_program_ids_are_each_threads_own():
    _cpu_only()
    out = torch.zeros(16, dtype=torch.int32)
    spin = torch.zeros(1, dtype=torch.int32)
    with concurrent_programs(workers=4) as run:
        _ids_kernel[(16,)](out, spin)
    assert torch.equal(out, torch.arange(1, 17, dtype=torch.int32))
    assert int(spin) == 48 and run.most_running == 4
    assert [(launch.kernel, launch.programs, launch.begun, launch.ended_well) for launch in run.launches] == [
        ("_ids_kernel", 16, 16, 16)]


def test_programs_waiting_for_each_other_end_when_all_fit():
    _cpu_only()
    count, out = torch.zeros(1, dtype=torch.int32), torch.zeros(6, dtype=torch.int32)
    with concurrent_programs(workers=6) as run:
        _barrier_kernel[(6,)](count, out)
    assert torch.equal(out, torch.full((6,), 6, dtype=torch.int32))
    assert run.launches[0].looks >= 6   # each program's first look at least


def test_a_wait_that_cannot_end_is_reported_as_a_hang():
    """The control: five slots for six programs that each wait for all six: the sixth never starts."""
    _cpu_only()
    count, out = torch.zeros(1, dtype=torch.int32), torch.zeros(6, dtype=torch.int32)
    with pytest.raises(ProgramsHung):
        with concurrent_programs(workers=5, timeout_s=3.0) as run:
            _barrier_kernel[(6,)](count, out)
    assert int(count) == 5 and (run.launches[0].begun, run.launches[0].ended_well) == (5, 0)


def test_the_executor_is_undone_after_its_block():
    from triton.runtime import interpreter
    _cpu_only()
    before = (interpreter.GridExecutor.__call__, interpreter.InterpreterBuilder.create_atomic_rmw)
    with concurrent_programs(workers=2):
        assert interpreter.GridExecutor.__call__ is not before[0]
    assert (interpreter.GridExecutor.__call__, interpreter.InterpreterBuilder.create_atomic_rmw) == before
    assert "grid_idx" not in interpreter.InterpreterBuilder.__dict__
    with pytest.raises(ValueError, match="workers must be >= 1"):
        with concurrent_programs(workers=0):
            pass


@pytest.mark.parametrize("workers,reverse", [(1, True), (5, True), (18, False)])
def test_split_k_sums_in_chunk_order_whoever_arrives_last(device, workers, reverse):
    """kernels/gemm.py's split-K: a tile's last chunk to finish adds every chunk's partial in chunk order.
    Programs taken in reverse (each tile's chunk 0 last: a sum in arrival order, or the last arriver's own
    partial first, would change bits here) or all at once (the counters' adds racing) give the bits of the
    interpreter's own loop (chunk 2 always last), and leave the tile counters at zero."""
    _cpu_only()
    from h3bench.harness.execute import as_bits
    from h3bench.kernels import gemm
    cfg = gemm.LaunchConfig(32, 32, 32, split_k=3)
    g = torch.Generator().manual_seed(9)
    a, w = torch.randn(40, 700, generator=g), torch.randn(70, 700, generator=g)
    assert 2 * gemm.k_chunk(700, 3) < 700   # three chunks, none empty (an empty one adds an exact zero)
    plain, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    with concurrent_programs(workers=workers, reverse=reverse) as run:
        got, _ = gemm.forward(a, w, None, cfg, out_dtype=torch.float32)
    assert [(launch.programs, launch.ended_well) for launch in run.launches] == [(18, 18)]   # 6 tiles x 3 chunks
    assert torch.equal(as_bits(got), as_bits(plain))
    assert not gemm.split_counters(a.device, 1).any()


# --- norm_modulate's exchanged c --------------------------------------------------------------------------

@contextlib.contextmanager
def _at_once(workers: int, timeout_s: float = 240.0):
    """concurrent_programs plus norm_modulate's switch that lets "exchange" post and wait under the
    interpreter, the backward recipes cached under the other setting dropped on the way in and out."""
    from h3bench.kernels import norm_modulate as K
    with concurrent_programs(workers, timeout_s) as run:
        K.PROGRAMS_AT_ONCE = True
        K._bwd_recipe.cache_clear()
        try:
            yield run
        finally:
            K.PROGRAMS_AT_ONCE = False
            K._bwd_recipe.cache_clear()


@pytest.mark.parametrize("workers", [3, 8])   # 3: one range's blocks, the fewest resident with which it can end
@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("table_rows", [9, 40])   # the local plan and the global one
def test_exchange_with_three_blocks_a_range_gives_the_split_values(device, monkeypatch, table_rows, ahead, workers):
    """split_dots "exchange" at H = 20 in blocks of 8 (three a range, seven ranges of at most four rows,
    21 programs): each block posts its partial dots of a step and waits for its two mates' (a count a range;
    `dots_ahead`: a count a block, one step behind), then adds the three block 0 first. With the split's
    first-pass chunk as wide as a block that is the split's order, so every output and gradient is the
    split's bits, as "recompute" gives them under the interpreter's own loop."""
    _cpu_only()
    from tests.test_kernel import _same_bits, _split_then_variant
    with _at_once(workers) as run:
        _, plain, got, rows_kernels, _ = _split_then_variant(device, monkeypatch, table_rows,
                                                             split_dots="exchange", dots_ahead=ahead)
    assert rows_kernels and all(meta["EXCHANGE"] and meta["AHEAD"] == ahead and grid == (21,)
                                for grid, meta in rows_kernels)
    # the waits ran: in each of the seven ranges the first block to post its first step must look again
    # (or, a step ahead, every block looks before its first step is finished)
    assert run.most_running == workers
    launches = run.of("_bwd_kernel")   # the split's (no looks), then the variant's
    assert all(launch.ended_well == launch.programs for launch in launches)
    exchanged = launches[len(launches) - len(rows_kernels):]
    assert all(launch.looks >= (21 if ahead else 7) for launch in exchanged)
    assert not any(launch.looks for launch in launches[:len(launches) - len(rows_kernels)])
    _same_bits(got, plain)


@pytest.mark.parametrize("ahead", [False, True])
def test_exchange_needs_a_whole_range_resident(device, monkeypatch, ahead):
    """The control of the test above: with two slots, a range's third block may never start while its first
    two wait for its partials: the launch's first two programs begin and neither ends (not a slow run, which
    would end programs and begin others). On the GPU a range is three programs of 132 or more resident."""
    _cpu_only()
    from h3bench.kernels import norm_modulate as K
    from tests.test_kernel import _config, _table_case, run as run_op
    split = _config(monkeypatch, 20, chunk_limit=4, local_max=16, fwd_kernel="rows", fwd_rows=2, bwd_rows=2,
                    bwd_chunk=0, bwd_cols=8, dots_rows=2, dots_chunk=8)
    _, inputs, grad_out = _table_case(device, 20, 26, 9, dtype="float32")
    monkeypatch.setattr(K, "launch_config", lambda h: dataclasses.replace(split, split_dots="exchange",
                                                                          dots_ahead=ahead))
    with pytest.raises(ProgramsHung):
        with _at_once(workers=2, timeout_s=4.0) as at_once:
            run_op(inputs, grad_out)
    hung = at_once.launches[-1]
    assert (hung.kernel, hung.programs, hung.begun, hung.ended_well) == ("_bwd_kernel", 21, 2, 0)


@pytest.mark.parametrize("producers", [1, 3])
def test_fused_backward_with_consumers_waiting_for_producers(device, monkeypatch, producers):
    """bwd_fused (kernels/NOTES.md v39) with its programs at once: consumers wait for their range's producers
    as on a GPU (under the interpreter's own loop every producer has finished before any consumer starts),
    with as few slots as one range holds; the split's bits as before."""
    _cpu_only()
    from tests.test_kernel import _same_bits, _split_then_variant
    with _at_once(workers=producers + 3):
        _, plain, got, rows_kernels, _ = _split_then_variant(device, monkeypatch, 40, bwd_fused=True,
                                                             fused_producers=producers)
    assert rows_kernels and all(meta["FUSED"] for _, meta in rows_kernels)
    _same_bits(got, plain)


@pytest.mark.parametrize("preset", ["dots-exchange", "dots-exchange-ahead-r1", "dots-exchange-ahead-c2048"])
def test_exchange_presets_at_12288_give_recomputes_bits(device, monkeypatch, preset):
    """The presets session20-call-1 times on the H200, at their own H = 12288 geometry (blocks of 4096 or
    2048: three or six a range, one to four rows a step), 40 rows of a 9-row table in five ranges, with one
    range's blocks as the only slots: every output and gradient bitwise "recompute"'s (the same partials,
    made again)."""
    _cpu_only()
    from h3bench.kernels import norm_modulate as K
    from tests.test_kernel import _same_bits, _table_case, run as run_op
    from tools.sweep_norm_modulate import _variant
    exchange = dataclasses.replace(_variant(preset, 12288), chunk_limit=8)   # five ranges of 8 rows
    blocks = K.cdiv(12288, exchange.bwd_cols)
    _, inputs, grad_out = _table_case(device, 12288, 40, 9, dtype="float32")
    monkeypatch.setattr(K, "launch_config", lambda h: dataclasses.replace(exchange, split_dots="recompute"))
    want = run_op(inputs, grad_out)
    monkeypatch.setattr(K, "launch_config", lambda h: exchange)
    with _at_once(workers=blocks) as run:
        got = run_op(inputs, grad_out)
    rows_launches = run.of("_bwd_kernel")
    assert rows_launches and all(launch.ended_well == launch.programs and launch.programs % blocks == 0
                                 and launch.programs > blocks and launch.looks > 0 for launch in rows_launches)
    _same_bits(got, want)

"""Kernels whose programs depend on each other, run under the interpreter with a launch's programs at once
(tests/concurrent_grid.py): first the executor itself (thread-local program ids, programs resident at most
`workers` at a time, a wait that cannot end reported as a hang), then the GEMMs' split-K (the last chunk to
arrive adds them all: in chunk order whoever it is). The GPU tests check the memory ordering, which this
cannot."""
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
    # programs that never wait may or may not overlap (the threads' scheduling, a busy CPU): only the
    # bound is the executor's; that 4 run at once is shown by the waiting kernels below
    assert int(spin) == 48 and 1 <= run.most_running <= 4
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

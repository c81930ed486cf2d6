"""Pieces every h3bench Triton kernel uses: launching, rounding, and the fixed-order segmented reduction.

Launching: three entry points, each `kernel[grid](*args, **meta)` minus triton's per-call Python, each
falling back to that plain path whenever the fast one could differ (under the interpreter, with a launch
hook installed (a profiler's), on a triton whose internals do not look as expected, or with
H3BENCH_FAST_LAUNCH=0):

* `launch(kernel, grid, *args, **meta)`: triton's binder runs on every call and the compiled kernel is
  looked up by the specialization it returns (dtypes, 16-byte alignment of pointers, divisibility of
  integers, constexpr values) plus the launch options, so nothing can launch a kernel compiled for other
  arguments. What is skipped: triton's option parsing, its cache-key string, the check of global values,
  grid canonicalization and launch metadata. Used by gate_residual, adaln_row_gather, row_gather, gemm.
* `launch_ready`: no binder at all, for a kernel whose compiled code depends on dtypes only
  (timestep_sinusoid).
* `launch_keyed`: the binder once per key the caller names (norm_modulate, the GEMM ops).

Each skips host work that a small op's call is mostly made of (kernels/notes/launch.md has the H200
figures and the commands). A remembered compiled kernel is called through `runner` (below), which skips
triton's launcher class.

The fixed-order segmented reduction (parameter gradients of gathered tables): the rows are split into
fixed chunks, one per program (`split_rows`: a function of the row count and the GPU's SM count only);
a program sorts its chunk by segment (`local_order`, a stable counting sort in registers) and walks the
segments in turn, each in ascending row order, accumulating in fp32 and writing one partial row per
(program, segment); `sum_partials` then adds, per column, the partials of programs 0, 1, ... in tiles
of P_TILE (a fixed tl.sum tree per tile, tiles left to right). No atomics: the order depends on the
inputs' indices and sizes only, so the sums repeat bitwise run to run.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:
    from triton import knobs as _knobs
except ImportError:  # a triton without knobs: `_hooks_installed` then always sends launches the plain way
    _knobs = None

# H3BENCH_FAST_LAUNCH=0: every launch through `kernel[grid]`, triton's own path (the reference the fast
# paths are tested against bitwise; their host-time win is in the module docstring).
ENABLED = os.environ.get("H3BENCH_FAST_LAUNCH", "1") != "0"
# Read once, as triton does when it decorates a kernel: the interpreter cannot be switched on later.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if INTERPRETED:  # tl.dot in a fixed order, not the CPU's BLAS (kernels/interpreted_dot.py says why)
    from h3bench.kernels import interpreted_dot

    interpreted_dot.install()
_COMPILED: dict = {}
# `runner` skips `CudaLauncher.__call__` unless H3BENCH_DIRECT_LAUNCH=0: host time on every launch
# (kernels/notes/launch.md has the figure). The switch is what `tools.hostcost --switch direct` flips to measure it.
DIRECT = os.environ.get("H3BENCH_DIRECT_LAUNCH", "1") != "0"


def _hooks_installed() -> bool:
    """A launch hook is set. Triton 3.6 keeps them as HookChain objects, empty unless one was added."""
    if _knobs is None:
        return True
    runtime = _knobs.runtime
    # one function, no helper per hook: this runs on every fast launch, where each Python call costs host time
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return ((enter is not None and bool(getattr(enter, "calls", True)))
            or (leave is not None and bool(getattr(leave, "calls", True))))


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    if not ENABLED or INTERPRETED:
        kernel[grid](*args, **meta)
        return
    _launch_fast(kernel, grid, torch.cuda.current_device(), args, meta)


def _launch_fast(kernel, grid, device: int, args, meta) -> None:
    try:
        binder = kernel.device_caches[device][4]
        bound, specialization, _ = binder(*args, **meta)
        key = (kernel, device, tuple(specialization), tuple(meta.items()))
        found = _COMPILED.get(key)
    except Exception:  # a triton whose internals differ: its own path is always right
        kernel[grid](*args, **meta)
        return
    if found is None or _hooks_installed():
        compiled = kernel[grid](*args, **meta)
        if compiled is not None and not hasattr(compiled, "result"):  # not an async-compile future
            _COMPILED[key] = runner(compiled)
        return
    run, head = found
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), *head, *bound.values())


# --- calling a compiled kernel ---------------------------------------------------------------------------
#
# `compiled.run(g0, g1, g2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`
# is triton's `CudaLauncher.__call__`: two closures and the scratch allocators in Python before its C
# `launch` (host time on every launch: see `DIRECT`). For a kernel that needs neither global nor
# profile scratch memory, that Python only adds fixed arguments, so `runner` calls the C `launch` with
# them itself. Only where its code was read: triton 3.6.0's `CudaLauncher.__call__(self, gridX, gridY,
# gridZ, stream, function, *args)` calls `self.launch(gridX, gridY, gridZ, stream, function,
# self.launch_cooperative_grid, self.launch_pdl, global_scratch, profile_scratch, *args)`, scratch None
# for a size of 0. Any other version, launcher class or signature keeps `compiled.run`.

DIRECT_VERSIONS = ("3.6.0",)
_LAUNCHER_ARGS = ("self", "gridX", "gridY", "gridZ", "stream", "function")


def runner(compiled) -> tuple:
    """(run, head) such that `run(g0, g1, g2, stream, *head, *args)` launches `compiled` on the grid and
    stream with the kernel arguments `args` and no launch hooks, as `compiled.run(g0, g1, g2, stream,
    compiled.function, compiled.packed_metadata, None, None, None, *args)` does."""
    plain = (compiled.run, (compiled.function, compiled.packed_metadata, None, None, None))
    if not DIRECT or triton.__version__ not in DIRECT_VERSIONS:
        return plain
    try:
        launcher = compiled.run
        call = type(launcher).__call__.__code__
        direct = (type(launcher).__name__ == "CudaLauncher" and call.co_argcount == len(_LAUNCHER_ARGS)
                  and call.co_varnames[:len(_LAUNCHER_ARGS)] == _LAUNCHER_ARGS
                  and launcher.global_scratch_size == 0 and launcher.profile_scratch_size == 0)
        if not direct:
            return plain
        return launcher.launch, (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl,
                                 None, None, compiled.packed_metadata, None, None, None)
    except AttributeError:
        return plain


# --- launching a kernel whose compiled code depends on dtypes only ----------------------------------------
#
# For an op whose whole cost is its host path (timestep_sinusoid: 2 MB at most), even triton's binder
# (a large share of a launch's host time: kernels/notes/launch.md) is worth
# skipping. That is only safe for a kernel whose compiled code cannot depend on an argument's value:
# every integer argument in `do_not_specialize`, every pointer the caller does not allocate itself in
# `do_not_specialize_on_alignment` (the others the caller guarantees 16-byte aligned: fresh torch
# allocations). Its compiled kernel then depends on the caller's `key` (the tensors' dtypes), the device
# and the constexprs only; `launch_ready` checks this once per key, through the binder's own
# specialization, and takes the plain path for anything it cannot prove (an integer beyond int32, a
# hook, the interpreter, H3BENCH_FAST_LAUNCH=0).

_READY: dict = {}
_I32 = (-(1 << 31), (1 << 31) - 1)


class NotReady(Exception):
    """The kernel's specialization is not fixed by the key: launch it the plain way."""


def launch_ready(kernel, grid: tuple[int, ...], device: int, key, args: tuple, meta: tuple) -> None:
    """`launch(kernel, grid, *args, **dict(meta))` on the current CUDA device `device`, the binder run
    once per (kernel, device, key, meta): `args` are the kernel's runtime arguments in its parameter order,
    `meta` its constexprs and launch options as a tuple of (name, value) pairs (hashable, so callers keep
    it). `key` must determine every dtype among `args`."""
    if not ENABLED or INTERPRETED:
        kernel[grid](*args, **dict(meta))
        return
    entry = _READY.get((kernel, device, key, meta))
    if entry is None or _hooks_installed() or not _ints_fit(args, entry[3]):
        _launch_fast(kernel, grid, device, args, dict(meta))
        if entry is None:
            _make_ready(kernel, device, key, args, meta)
        return
    run, head, tail, _ = entry
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), *head, *args, *tail)


def ready_runner(kernel, device: int, key, meta: tuple) -> tuple | None:
    """(run, head, tail) of a `launch_ready` entry made for (kernel, device, key, meta), or None: for a
    caller that keeps it and launches with `run(g0, g1, g2, stream, *head, *args, *tail)` itself, e.g. with
    int pointers (the C launcher then skips each tensor's data_ptr() call and its cuPointerGetAttribute
    check: kernels/notes/launch.md). Such a caller must take the entry only while
    `fast_launch_allowed()` and with every integer argument in int32, as `launch_ready` does."""
    entry = _READY.get((kernel, device, key, meta))
    return None if entry is None else entry[:3]


def fast_launch_allowed() -> bool:
    """A remembered compiled kernel may be launched directly: the fast paths are on and no launch hook
    (a profiler's) is installed."""
    return ENABLED and not INTERPRETED and not _hooks_installed()


def _ints_fit(args: tuple, int_positions: tuple[int, ...]) -> bool:
    lo, hi = _I32
    for i in int_positions:  # a loop, not all() over a generator: less host time per launch (tools/hostcost_cpu.py)
        if not lo <= args[i] <= hi:
            return False
    return True


def _make_ready(kernel, device: int, key, args: tuple, meta: tuple) -> None:
    """Remember the compiled kernel of this launch for (kernel, device, key, meta), if its specialization
    provably depends on nothing but dtypes (`ready_specialization`); a kernel that does not qualify is
    launched the plain way every time."""
    try:
        binder = kernel.device_caches[device][4]
        bound, specialization, _ = binder(*args, **dict(meta))
        names = list(bound)
        tail, ints = ready_specialization(kernel, names, specialization, len(args), meta)
        found = _COMPILED.get((kernel, device, tuple(specialization), meta))
    except Exception:  # NotReady (a kernel that does not qualify), or a triton whose internals differ
        return
    if found is not None:
        _READY[(kernel, device, key, meta)] = (*found, tail, ints)


def ready_specialization(kernel, names: list, specialization: list, n_args: int, meta: tuple
                         ) -> tuple[tuple, tuple[int, ...]]:
    """(the constexpr values that follow the runtime arguments, the positions of the integer arguments),
    or NotReady unless: the runtime arguments come first and the constexprs after them, in `meta`'s
    order; every integer argument is a non-specialized int32; every pointer is either non-specialized on
    alignment or specialized as 16-byte aligned (the caller's own allocations)."""
    params = {p.name: p for p in kernel.params}
    given = dict(meta)
    if names[n_args:] != [n for n in given if n in params] or any(params[n].is_constexpr for n in names[:n_args]):
        raise NotReady("runtime arguments first, then the constexprs")
    ints = []
    for i, (name, spec) in enumerate(zip(names[:n_args], specialization[:n_args])):
        kind, attr = spec[0], spec[1] if len(spec) > 1 else None
        if kind in ("i32", "i64", "u64", "i1"):
            if kind != "i32" or not params[name].do_not_specialize:
                raise NotReady(f"{name}: {kind}, specialized on its value")
            ints.append(i)
        elif kind.startswith("*"):
            if attr not in (None, "", "D") or (attr != "D" and not params[name].do_not_specialize_on_alignment):
                raise NotReady(f"{name}: pointer specialization {attr!r}")
        else:
            raise NotReady(f"{name}: {kind}")
    return tuple(given[n] for n in names[n_args:]), tuple(ints)


# --- launching with the caller's own specialization key ----------------------------------------------------
#
# A GEMM launch has ~30 runtime arguments, and triton's binder, run on every `launch`, reads each one to
# find the specialization (int values, pointer alignment, dtypes). A caller that already holds every
# integer argument and knows which tensors it allocated itself can name the specialization more cheaply:
# `launch_keyed` takes its key, runs the binder once per key (the plain path, which compiles if needed)
# and afterwards calls the compiled kernel directly. The key must determine everything the binder looks
# at: every integer argument's value, the dtype and the 16-byte alignment of every tensor that is not the
# caller's fresh allocation, the constexprs and launch options (the caller's `meta`), the device.

_KEYED: dict = {}
# H3BENCH_KEYED_LAUNCH=0: `launch`'s binder on every call instead, which costs more host time a call
# (kernels/notes/launch.md). The switch is what `tools.hostcost --switch keyed` flips.
KEYED = os.environ.get("H3BENCH_KEYED_LAUNCH", "1") != "0"


def tensor_key(t: torch.Tensor) -> tuple:
    """What triton's binder reads of a tensor argument, for a launch key: its dtype and its address modulo
    16 (the 16-byte alignment)."""
    return t.dtype, t.data_ptr() & 15


def launch_keyed(kernel, grid: tuple[int, ...], device: int, key, args: tuple, meta: dict) -> None:
    """`launch(kernel, grid, *args, **meta)` on the current CUDA device `device` for a caller whose `key`
    (hashable) determines the launch's specialization as said above; `args` are the kernel's runtime
    arguments in its parameter order, `meta` every constexpr by name and the launch options."""
    if not ENABLED or INTERPRETED:
        kernel[grid](*args, **meta)
        return
    entry = _KEYED.get(key) if KEYED else None
    if entry is None or _hooks_installed():
        _launch_fast(kernel, grid, device, args, meta)
        if entry is None and KEYED:
            _remember_keyed(kernel, device, key, args, meta)
        return
    run, head, tail = entry
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), *head, *args, *tail)


def _remember_keyed(kernel, device: int, key, args: tuple, meta: dict) -> None:
    """The compiled kernel `_launch_fast` just used for this launch, and the constexpr values that follow
    the runtime arguments, under `key`; nothing when triton's internals look different (the plain path
    then runs every time)."""
    try:
        bound, specialization, _ = kernel.device_caches[device][4](*args, **meta)
        names = list(bound)
        params = {p.name: p for p in kernel.params}
        if any(params[n].is_constexpr for n in names[:len(args)]):
            return
        tail = tuple(meta[n] for n in names[len(args):])
        found = _COMPILED.get((kernel, device, tuple(specialization), tuple(meta.items())))
    except Exception:
        return
    if found is not None:
        _KEYED[key] = (*found, tail)


def interpreter_active() -> bool:
    """TRITON_INTERPRET is on: kernels run on the CPU, and bf16 stores are rounded by hand."""
    return INTERPRETED


def require_triton_device(device: torch.device) -> None:
    """Triton runs on CUDA, or on the CPU under its interpreter: say so before anything is launched."""
    if device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(f"Triton needs a CUDA device here ({device}); set TRITON_INTERPRET=1 before triton "
                           "is imported to run it under the interpreter")


# The interpreter's fp32 -> bf16 cast truncates: round by hand there (`rounded`).
BY_HAND = INTERPRETED


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints. `triton.cdiv` is a constexpr_function: called from Python it unwraps its
    arguments through triton's JIT wrapper, microseconds a call (kernels/notes/launch.md)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0), as `triton.next_power_of_2` without its wrapper."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_rows(rows: int, device: torch.device, programs_per_sm: int, chunk_limit: int) -> tuple[int, int]:
    """(programs, rows per program) of a fixed-order reduction over `rows` rows: about `programs_per_sm`
    programs per SM, each with at most `chunk_limit` rows, every program at least one row. The split is
    part of the summation order, so it depends on the row count and the device only. The interpreter
    runs programs one after another: as few as possible there."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        target = sm_count(index) * programs_per_sm
    else:
        target = 1
    chunk = cdiv(rows, max(1, min(target, rows)))
    chunk = min(chunk, chunk_limit)
    return cdiv(rows, chunk), chunk


def split_row_chunks(rows: int, device: torch.device, programs_per_sm: int, column_programs: int,
                     chunk_limit: int) -> tuple[int, int]:
    """(row chunks, rows per chunk) of a fixed-order reduction launched as a (row chunk, column block)
    grid of `column_programs` programs per chunk: about `programs_per_sm` programs per SM in all, each
    chunk at most `chunk_limit` rows, every chunk at least one row. As `split_rows`, a function of the
    row count, the column split and the GPU's SM count only (it is part of the summation order); one
    chunk under the interpreter."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        target = max(1, (sm_count(index) * programs_per_sm) // max(1, column_programs))
    else:
        target = 1
    chunk = cdiv(rows, max(1, min(target, rows)))
    chunk = max(1, min(chunk, chunk_limit))
    return cdiv(rows, chunk), chunk


def param_tile(programs: int, limit: int) -> int:
    """Partial rows per tl.sum when summing partials: all of them in one tile up to `limit`."""
    return min(limit, next_power_of_2(programs))


# --- Triton pieces ------------------------------------------------------------------------------------

@triton.jit
def rounded(v, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """fp32 -> `dtype`, rounding to nearest even. The GPU's cast does that; the Triton interpreter's
    fp32 -> bf16 cast truncates, so there (BY_HAND) the rounding is done on the bits first and the
    cast is exact. Never on the GPU: there it cost norm_modulate's forward kernel 17 us
    (kernels/notes/norm_modulate.md, "hand rounding on the GPU")."""
    if BY_HAND:
        if dtype == tl.bfloat16:
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
    return v.to(dtype)


@triton.jit
def segment(idx, ok, M):
    """Segment of each row: its table row, M for an index out of range, M + 1 for padding."""
    seg = tl.where((idx < 0) | (idx >= M), M, idx).to(tl.int32)  # compared as loaded: no wrap
    return tl.where(ok, seg, M + 1)


@triton.jit
def local_order(IDX, ORDER, pid, lo, n, M, CMAX: tl.constexpr, K_P2: tl.constexpr):
    """A stable counting sort of this program's rows lo .. lo + n - 1 by segment (table row, M for a
    bad index): writes their offsets from lo, grouped by segment and ascending within each, to
    ORDER[pid * CMAX + 0 .. n - 1]; returns where each segment starts in that list and its length."""
    i = tl.arange(0, CMAX)
    ok = i < n
    seg = segment(tl.load(IDX + lo + i, mask=ok, other=0), ok, M)
    ks = tl.arange(0, K_P2)
    onehot = (seg[:, None] == ks[None, :]).to(tl.int32)
    counts = tl.where(ks <= M, tl.sum(onehot, axis=0), 0)   # segment M + 1 is padding
    starts = tl.cumsum(counts, axis=0) - counts
    rank = tl.sum((tl.cumsum(onehot, axis=0) - onehot) * onehot, axis=1)
    slot = tl.sum(onehot * starts[None, :], axis=1) + rank
    tl.store(ORDER + pid * CMAX + slot, i, mask=ok)
    tl.debug_barrier()  # the loop below reads the list back, each thread other threads' writes
    return starts, counts


@triton.jit
def pick(vector, ks, k):
    """vector[k] for a scalar k (a register vector cannot be indexed)."""
    return tl.sum(tl.where(ks == k, vector, 0), axis=0)


@triton.jit
def program_rows(IDX, ORDER, n_rows, M, CHUNK, CMAX: tl.constexpr, K_P2: tl.constexpr):
    """This program's rows lo .. lo + n - 1, sorted by segment (`local_order`)."""
    pid = tl.program_id(0)
    lo = pid * CHUNK
    n = tl.minimum(CHUNK, n_rows - lo)
    starts, counts = local_order(IDX, ORDER, pid, lo, n, M, CMAX, K_P2)
    return pid, lo, n, starts, counts


@triton.jit
def sum_partials(P, count, stride, cols, col_ok, P_TILE: tl.constexpr):
    """Rows 0 .. count - 1 of P (row p at P + p * stride) summed per column in fp32: tiles of P_TILE
    rows, each by a fixed tl.sum tree, added left to right."""
    acc = tl.zeros(cols.shape, dtype=tl.float32)
    for p0 in range(0, count, P_TILE):
        p = p0 + tl.arange(0, P_TILE)
        mask = (p < count)[:, None] & col_ok[None, :]
        acc += tl.sum(tl.load(P + p.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0), axis=0)
    return acc


@triton.jit(do_not_specialize=["n_programs"])
def table_from_partials(PART, DT, n_programs, W: tl.constexpr, M, stride_dt, BLOCK: tl.constexpr,
                        P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    """Grid (cdiv(W, BLOCK), M): DT[m, cols] = the sum over p of PART[p, m, cols] (PART: [programs, M, W]
    fp32, contiguous) by `sum_partials`, rounded once to DT's dtype."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < W
    m = tl.program_id(1)
    total = sum_partials(PART + m * W, n_programs, M * W, cols, col_ok, P_TILE)
    tl.store(DT + m * stride_dt + cols, rounded(total, DT.dtype.element_ty, BY_HAND), mask=col_ok)

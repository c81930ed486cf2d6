"""What the evidence was measured on: device, versions, commits, and the measured copy, read and write
bandwidths (harness/bandwidth.py) with the floor model that prices bytes at them (harness/floors.py)."""
from __future__ import annotations

import importlib.util
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

import torch

from h3bench.harness import bandwidth as memory
from h3bench.harness.floors import FLOOR_MODEL
from h3bench.harness.schema import Environment, TimingRecord
from h3bench.harness.timing import STREAM, median, take

# The libraries the prior art records, by distribution name.
LIBRARIES = ("torch", "triton", "diffusers", "vllm", "flashinfer-python", "sglang", "liger-kernel",
             "transformer_engine", "megatron-core")
_DISTRIBUTION_ALIASES = {"transformer_engine": ("transformer_engine", "transformer-engine")}

REPO_ROOT = Path(__file__).resolve().parent.parent
COPY_BYTES_CUDA = 1 << 30   # 1 GiB each way: far past the 50 MB L2
COPY_BYTES_CPU = 1 << 27


def library_version(name: str) -> Optional[str]:
    for dist in _DISTRIBUTION_ALIASES.get(name, (name,)):
        try:
            return metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def git(args: list[str], cwd: Path) -> Optional[str]:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def h3bench_commit() -> Optional[str]:
    """HEAD of h3bench's checkout; H3BENCH_COMMIT names it where the tree is a copy without history
    (a GPU machine given a copy of the working tree, not the repository)."""
    return os.environ.get("H3BENCH_COMMIT") or git(["rev-parse", "HEAD"], REPO_ROOT)


def tracked_tree_dirty() -> Optional[bool]:
    head = git(["rev-parse", "HEAD"], REPO_ROOT)
    if head is None:
        return None  # no history here: whether the tree matches a commit is unknown, not "clean"
    named = os.environ.get("H3BENCH_COMMIT")
    if named and not head.startswith(named):
        return None  # a copy of another checkout: its git state says nothing about ours
    status = git(["status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    return None if status is None else bool(status)


RL_KERNEL_MARKER = "H3BENCH_SOURCE"  # written beside `rl_engine` by tools/build_rl_kernel.sh


def rl_kernel_commit() -> Optional[str]:
    """What the importable `rl_engine` was built from, without importing it: the marker line a build of
    the reassembly (docs/third_party.md) writes (it names the upstream commits), or a git checkout's
    HEAD; None when rl_engine is not importable."""
    try:
        spec = importlib.util.find_spec("rl_engine")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).resolve().parent
    marker = root / RL_KERNEL_MARKER
    if marker.is_file():
        return marker.read_text().strip() or None
    return git(["rev-parse", "HEAD"], root)


def measure_copy_bandwidth(device: torch.device, nbytes: Optional[int] = None,
                           warmup: int = 3, reps: int = 20) -> tuple[float, int]:
    """Median device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    nbytes = nbytes or (COPY_BYTES_CUDA if device.type == "cuda" else COPY_BYTES_CPU)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    samples = take(lambda: dst.copy_(src), device, STREAM, reps)
    moved = 2 * src.numel() * src.element_size()
    return moved / (median(samples) * 1e3), moved


def capture(device: torch.device, modes: dict[str, dict], measure_bandwidth: bool = True,
            timing: Optional[TimingRecord] = None) -> Environment:
    cuda = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if cuda else None
    bandwidth, moved = measure_copy_bandwidth(device) if measure_bandwidth else (None, None)
    rates = memory.measure(device) if measure_bandwidth else None
    return Environment(
        gpu=props.name if props else None,
        capability=[props.major, props.minor] if props else None,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        tf32=bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32) if cuda
        else False,
        libraries={name: library_version(name) for name in LIBRARIES},
        megatron_source_commit=None,
        mode_environment=modes,
        device=f"cuda:{props.name}" if props else f"cpu:{platform.processor() or platform.machine()}",
        copy_bandwidth_gbps=bandwidth,
        copy_bandwidth_bytes=moved,
        read_bandwidth_gbps=rates.read.gbps if rates else None,
        read_bandwidth_bytes=rates.read.nbytes if rates else None,
        read_bandwidth_kernel=rates.read.kernel if rates else None,
        write_bandwidth_gbps=rates.write.gbps if rates else None,
        write_bandwidth_bytes=rates.write.nbytes if rates else None,
        write_bandwidth_kernel=rates.write.kernel if rates else None,
        bandwidth_method=rates.method if rates else None,
        floor_model=FLOOR_MODEL if rates else None,
        driver=_driver_version() if cuda else None,
        host=socket.gethostname(),
        timing=timing,
    )


def _driver_version() -> Optional[str]:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None

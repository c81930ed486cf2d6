"""Under the Triton interpreter our kernels' bits do not depend on the CPU's BLAS: `tl.dot` is a fixed-order
chain there (kernels/interpreted_dot.py), not numpy's matmul. numpy's OpenBLAS picks its kernel by CPU family
(OPENBLAS_CORETYPE overrides the pick, at load time: hence one child process per kernel); an FMA kernel such
as Haswell's or Zen's gave a row different bits depending on its place in the block, so rows alone and in a
batch differed on AMD and Intel-AVX2 machines and agreed on older ones.

Each child runs timestep_mlp (two GEMMs, forward and backward) on 70 rows and on rows alone, and prints a
digest of every output and gradient. All children must print the same digests, and rows alone must equal
the batch's. A child forced onto an OpenBLAS kernel this CPU cannot run (SkylakeX without AVX-512) would die
of an illegal instruction if anything it runs called numpy's BLAS."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORES = ("", "Prescott", "Haswell", "Zen", "SkylakeX")  # "": this CPU's own pick

CHILD = r'''
import hashlib, json
import torch
from h3bench.kernels.timestep_mlp_api import timestep_mlp
from tools.openblas_core import openblas_core

g = torch.Generator().manual_seed(5)
x, w1, b1 = torch.randn(70, 32, generator=g), torch.randn(64, 32, generator=g) / 6, torch.randn(64, generator=g)
w2, b2, dy = torch.randn(48, 64, generator=g) / 8, torch.randn(48, generator=g), torch.randn(70, 48, generator=g)

def run(rows):
    leaves = [t.clone().requires_grad_() for t in (x[rows], w1, b1, w2, b2)]
    y = timestep_mlp(*leaves)
    y.backward(dy[rows])
    return [y.detach()] + [leaf.grad for leaf in leaves]

def digest(tensors):
    return hashlib.sha256(b"".join(t.contiguous().view(torch.int32).numpy().tobytes() for t in tensors)).hexdigest()

batch = run(slice(0, 70))
alone = all(torch.equal(run(slice(r, r + 1))[0].view(torch.int32), batch[0][r:r + 1].view(torch.int32))
            for r in (0, 31, 32, 69))
print(json.dumps({"core": openblas_core(), "digest": digest(batch), "alone_equals_batch": alone}))
'''


def child(core: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(TRITON_INTERPRET="1", **({"OPENBLAS_CORETYPE": core} if core else {}))
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"OPENBLAS_CORETYPE={core!r}: exit {done.returncode}\n{done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bits_are_the_same_under_every_blas_kernel():
    from h3bench.kernels.common import interpreter_active
    if not interpreter_active():
        pytest.skip("a property of the interpreted kernels (the CPU tests); the GPU runs its own tl.dot")
    found = {core or "default": child(core) for core in CORES}
    assert all(r["alone_equals_batch"] for r in found.values()), found
    assert len({r["digest"] for r in found.values()}) == 1, found
    cores = {r["core"] for r in found.values()}
    # the switch really took: OpenBLAS reported more than one kernel across the children
    assert cores == {"unknown"} or len(cores) > 1, found

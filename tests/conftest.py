"""Tests run on the CPU; Triton kernels run under its interpreter, which must be switched on before
triton is first imported. H3BENCH_TEST_DEVICE=cuda runs the device-parametrised tests on a GPU."""
import os

DEVICE = os.environ.get("H3BENCH_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return torch.device(DEVICE)

"""tools.kernel_times' arithmetic: per-step device times from profiler averages (CPU: fake events)."""
from types import SimpleNamespace

import torch

from tools.kernel_times import per_kernel_us, sync_lines

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _event(key, total, device_type):
    return SimpleNamespace(key=key, device_time_total=total, device_type=device_type)


def test_device_kernels_only_divided_by_steps_largest_first():
    events = [_event("_fwd_rows_kernel", 4000.0, CUDA), _event("aten::empty", 900.0, CPU),
              _event("_bwd_kernel", 7000.0, CUDA), _event("idle", 0.0, CUDA)]
    assert per_kernel_us(events, 20) == {"_bwd_kernel": 350.0, "_fwd_rows_kernel": 200.0}
    assert list(per_kernel_us(events, 20)) == ["_bwd_kernel", "_fwd_rows_kernel"]


def test_older_profiler_name():
    event = SimpleNamespace(key="k", cuda_time_total=30.0, device_type=CUDA)
    assert per_kernel_us([event], 3) == {"k": 10.0}


def test_sync_lines_keep_synchronizing_operations_only():
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
              "operations (Triggered internally at Module.cpp:1003.)")
    sync = "called a synchronizing CUDA operation\nException raised from warn_or_error_on_sync"
    assert sync_lines([notice, sync, "something else"]) == ["called a synchronizing CUDA operation"]
    assert sync_lines([notice]) == []

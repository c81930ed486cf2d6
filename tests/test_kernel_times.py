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


def test_fwd_bwd_step_runs_our_row_or_torch_rms_norm_alone(device):
    """The step kernel_times profiles (on the CPU our row runs under the interpreter): our row gives every
    leaf a gradient; the torch row is F.rms_norm alone (x and w get its gradients, the tables none)."""
    from tools.kernel_times import fwd_bwd_step
    g = torch.Generator().manual_seed(3)
    t = {"x": torch.randn(6, 32, generator=g).bfloat16(), "w": (1 + torch.rand(32, generator=g)).bfloat16(),
         "sh": (0.1 * torch.randn(4, 32, generator=g)).bfloat16(),
         "sc": (0.1 * torch.randn(4, 32, generator=g)).bfloat16(), "idx": torch.tensor([0, 3, 1, 1, 2, 0])}
    t = {name: tensor.to(device) for name, tensor in t.items()}
    dy = torch.randn(6, 32, generator=g).bfloat16().to(device)
    ours, ours_leaves = fwd_bwd_step(t, torch_row=False, dy=dy)
    ours()
    assert all(leaf.grad is not None for leaf in ours_leaves)
    ref, ref_leaves = fwd_bwd_step(t, torch_row=True, dy=dy)
    ref()
    assert ref_leaves[2].grad is None and ref_leaves[3].grad is None
    x, w = (t[n].detach().requires_grad_() for n in ("x", "w"))
    torch.nn.functional.rms_norm(x, (32,), w, 1e-6).backward(dy)
    assert torch.equal(ref_leaves[0].grad, x.grad) and torch.equal(ref_leaves[1].grad, w.grad)
    assert not torch.equal(ours_leaves[0].grad, x.grad)   # the modulation changes our row's x gradient


def _kernel(name, start, total, device_type=CUDA):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), device_time_total=total,
                           device_type=device_type)


def test_launch_means_by_position_in_the_step():
    """tools.gemm_kernel_times' per-launch means: kernels in start order cut into equal steps, the same
    kernel at two positions (GEMM1, GEMM2) kept apart; host events ignored; unequal steps give []."""
    from tools.gemm_kernel_times import launch_means
    events = [_kernel("_gemm_kernel", 30, 40.0), _kernel("_gemm_kernel", 0, 8.0), _kernel("aten::empty", 5, 3.0, CPU),
              _kernel("_gemm_kernel", 100, 10.0), _kernel("_gemm_kernel", 130, 44.0)]
    assert launch_means(events, 2) == [["_gemm_kernel", 9.0], ["_gemm_kernel", 42.0]]
    assert launch_means(events[:4], 2) == []
    assert launch_means([], 2) == []


def test_a_failing_case_is_kept_as_its_error_and_the_next_case_runs(monkeypatch, capsys):
    """A variant that fails (e.g. does not compile at one width) is printed and kept as an error record;
    the cases after it are still measured (the GPU call must not lose them)."""
    from types import SimpleNamespace

    from tools import kernel_times as KT

    def measure(hidden, table_rows, variant, *rest):
        if variant == "broken":
            raise RuntimeError("out of resources: shared memory\nmore text")
        return KT.KernelTimes(hidden, table_rows, variant, 8, 2, {"_bwd_kernel": 3.0}, 3.0, 4.0, [])
    monkeypatch.setattr(KT, "measure", measure)
    args = SimpleNamespace(rows=8, warmup=0, steps=2, trace="")
    got = [KT.measured_or_error(12288, 9, variant, args) for variant in ("broken", "default")]
    assert got[0] == {"hidden": 12288, "table_rows": 9, "variant": "broken",
                      "error": "RuntimeError: out of resources: shared memory"}
    assert got[1]["variant"] == "default" and got[1]["total_us"] == 3.0
    printed = capsys.readouterr().out
    assert "H=12288 M=9 broken: ERROR RuntimeError" in printed and "H=12288 M=9 default: 3.0 us" in printed

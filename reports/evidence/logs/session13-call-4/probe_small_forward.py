"""Session 13, call 4: the inference forward at R = 4097 (the sweep's small_batch streamed it at 63.7 us in
call 3 against 37.1 in 4d10c6b's sweep): per-sample and stream timings, twice, and the kernel's device
time under torch.profiler, for the default (x read again), fwd-no-reload and torch F.rms_norm."""
import torch

from harness.timing import STREAM, SYNCHRONIZED, median, take
from tools.kernel_times import per_kernel_us
from tools.sweep_norm_modulate import _steps, _variant, make_case, using_config

dev = torch.device("cuda")
for rows in (4097, 32768):
    _, t = make_case(dev, 5376, rows, 9)
    for variant in ("default", "fwd-no-reload", "torch"):
        forward, _, _ = _steps("torch_rms_norm" if variant == "torch" else "ours", t, 1e-6)
        config = _variant(variant, 5376) if variant == "fwd-no-reload" else None
        with using_config(config):
            for _ in range(20):
                forward()
            torch.cuda.synchronize()
            figures = [(round(median(take(forward, dev, SYNCHRONIZED, 100)), 1),
                        round(median(take(forward, dev, STREAM, 100)), 1)) for _ in range(2)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    forward()
                torch.cuda.synchronize()
        kernels = per_kernel_us(prof.key_averages(), 20)
        print(f"R={rows} {variant}: fwd (sync, stream) us {figures}; kernels {kernels}", flush=True)

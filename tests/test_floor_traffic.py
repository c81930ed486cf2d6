"""Each op's bytes read and bytes written (`floor_traffic`), forward and forward+backward, counted here from
the tensors the op itself makes (their element counts and dtypes) and the shapes and dtypes of its outputs,
at one small size per op: the arithmetic in the ops' docstrings, checked against real tensors."""
from __future__ import annotations

import torch

from h3bench.harness.ops import get_op
from h3bench.harness.ops.base import Traffic

CPU = torch.device("cpu")
ROWS = 5
SEED = 3


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def case(op_name: str, **params):
    op = get_op(op_name)
    p = op.params_type(**params)
    tensors = op.make_inputs(p, ROWS, SEED, CPU).tensors
    grad_outs = op.make_grad_outs(p, ROWS, SEED, CPU)
    return op, p, tensors, grad_outs


def check(op, params, forward: Traffic, backward_added: Traffic) -> None:
    assert op.floor_traffic(params, ROWS, backward=False) == forward
    both = Traffic(read=forward.read + backward_added.read, written=forward.written + backward_added.written)
    assert op.floor_traffic(params, ROWS, backward=True) == both
    assert op.floor_bytes(params, ROWS, backward=True) == both.read + both.written


def test_norm_modulate():
    op, p, t, (dy,) = case("norm_modulate", hidden=64, timesteps=4, modalities=3, dtype="bfloat16", eps=1e-6)
    y = ROWS * 64 * 2                                  # [R, H] bf16
    assert dy.dtype == torch.bfloat16 and nbytes(dy) == y
    # forward: x in, y out; backward: x and dy in, dx out (tables, w and idx left out)
    check(op, p, Traffic(read=nbytes(t["x"]), written=y),
          Traffic(read=nbytes(t["x"], dy), written=nbytes(t["x"])))


def test_timestep_sinusoid():
    op, p, t, _ = case("timestep_sinusoid", freq_dim=16, max_period=10000, downscale_freq_shift=0.0)
    out = ROWS * 16 * 4                                # [R, freq_dim] fp32
    # no backward: forward+backward is the forward
    check(op, p, Traffic(read=nbytes(t["t"]), written=out), Traffic(read=0, written=0))


def test_timestep_mlp():
    op, p, t, (dy,) = case("timestep_mlp", freq_dim=8, hidden=16, temb_dim=12)
    weights = nbytes(t["w1"], t["b1"], t["w2"], t["b2"])
    out = ROWS * 12 * 4                                # [R, temb_dim] fp32
    # backward: dy, x, W1, b1, W2 in; dx and the four parameter gradients out
    check(op, p, Traffic(read=nbytes(t["x"]) + weights, written=out),
          Traffic(read=nbytes(dy, t["x"], t["w1"], t["b1"], t["w2"]), written=nbytes(t["x"]) + weights))


def test_adaln_projection():
    op, p, t, (dy,) = case("adaln_projection", hidden=4, temb_dim=12, chunks=6, modalities=3)
    table = ROWS * 6 * 3 * 4 * 2                       # [R, chunks * modalities * hidden] bf16
    assert nbytes(dy) == table and t["temb"].dtype == torch.float32
    # backward: dy, temb, W in; dtemb (fp32), dW, db out
    check(op, p, Traffic(read=nbytes(t["temb"], t["w"], t["b"]), written=table),
          Traffic(read=nbytes(dy, t["temb"], t["w"]), written=nbytes(t["temb"], t["w"], t["b"])))


def test_adaln_row_gather():
    op, p, t, grads = case("adaln_row_gather", hidden=8, timesteps=4, modalities=3, chunks=6, dtype="bfloat16")
    outs = 6 * ROWS * 8 * 2                            # six [R, H] bf16
    assert nbytes(*grads) == outs and t["ti"].dtype == torch.int64
    indices = nbytes(t["ti"], t["tag"])
    # backward: the indices and six upstream gradients in; the table gradient out
    check(op, p, Traffic(read=indices + nbytes(t["table"]), written=outs),
          Traffic(read=indices + outs, written=nbytes(t["table"])))


def test_final_adaln_out():
    op, p, t, (dout,) = case("final_adaln_out", hidden=8, temb_dim=6, timesteps=4, modalities=3, dtype="bfloat16",
                             temb_dtype="float32", eps=1e-6)
    out = ROWS * 8 * 2                                 # [R, H] bf16
    # only W of the fixed tensors is counted (b, nw, temb left out); backward: dout, x, ti, W in; dx, dW out
    check(op, p, Traffic(read=nbytes(t["x"], t["ti"], t["w"]), written=out),
          Traffic(read=nbytes(dout, t["x"], t["ti"], t["w"]), written=nbytes(t["x"], t["w"])))


def test_gate_residual():
    op, p, t, (dout,) = case("gate_residual", hidden=8, timesteps=4, modalities=3, chunks=6, dtype="bfloat16")
    out = ROWS * 8 * 2                                 # [R, H] bf16
    gate = nbytes(t["gate"])                           # the [T*M, H] view, not the whole table
    assert gate == 4 * 3 * 8 * 2
    # backward: dout, y, idx, gate in; dres, dy, dgate out
    check(op, p, Traffic(read=nbytes(t["res"], t["y"], t["idx"]) + gate, written=out),
          Traffic(read=nbytes(dout, t["y"], t["idx"]) + gate, written=nbytes(t["res"], t["y"]) + gate))


def test_rms_norm():
    op, p, t, (dy,) = case("rms_norm", hidden=64, dtype="bfloat16", eps=1e-5)
    y = ROWS * 64 * 2                                  # [R, H] bf16
    assert nbytes(dy) == y
    # forward: x, w in; y out; backward: x, dy, w in; dx, dw out
    check(op, p, Traffic(read=nbytes(t["x"], t["w"]), written=y),
          Traffic(read=nbytes(t["x"], dy, t["w"]), written=nbytes(t["x"], t["w"])))


def test_layer_norm():
    op, p, t, (dy,) = case("layer_norm", hidden=64, dtype="bfloat16", param_dtype="float32", eps=1e-6)
    y = ROWS * 64 * 2                                  # [R, H] bf16; w and b fp32
    assert nbytes(dy) == y and t["w"].dtype == t["b"].dtype == torch.float32
    # forward: x, w, b in; y out; backward: x, dy, w in; dx, dw, db out
    check(op, p, Traffic(read=nbytes(t["x"], t["w"], t["b"]), written=y),
          Traffic(read=nbytes(t["x"], dy, t["w"]), written=nbytes(t["x"], t["w"], t["b"])))


def test_linear():
    op, p, t, (dy,) = case("linear", in_features=6, out_features=10, dtype="bfloat16")
    y = ROWS * 10 * 2                                  # [R, out_features] bf16
    assert nbytes(dy) == y
    # forward: x, W in; y out; backward: dy, W (for dx), x (for dW) in; dx, dW out
    check(op, p, Traffic(read=nbytes(t["x"], t["w"]), written=y),
          Traffic(read=nbytes(dy, t["w"], t["x"]), written=nbytes(t["x"], t["w"])))


def test_softmax():
    op, p, t, (dy,) = case("softmax", width=64, dtype="float32")
    y = ROWS * 64 * 4                                  # [R, S] fp32
    # forward: x in, y out; backward: y (saved) and dy in, dx out
    check(op, p, Traffic(read=nbytes(t["x"]), written=y), Traffic(read=y + nbytes(dy), written=nbytes(t["x"])))

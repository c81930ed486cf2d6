"""kernels/graph_replay.py: when a call's launches are captured and replayed, and (on a GPU) that a
replayed timestep_mlp forward gives the plain launches' bits and follows its inputs' contents."""
import pytest
import torch

from kernels import graph_replay
from kernels.graph_replay import GraphCache

from tests.test_kernel_gemm import MLP_NAMES, as_bits, mlp_case


class FakeGraph:
    def __init__(self, launch, log):
        self.launch, self.log = launch, log

    def replay(self):
        self.log.append("replay")
        self.launch()


def fake_cache(log, capacity=8, fail=False):
    def capture(launch):
        log.append("capture")
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return FakeGraph(launch, log)
    return GraphCache(capacity, capture)


def test_a_graph_is_captured_on_a_repeated_key_and_replayed_after():
    log = []
    cache = fake_cache(log)
    calls = []
    keys = ("a", "a", "a", "b", "a", "b", "b", "b")
    for key in keys:
        cache.run(key, lambda key=key: calls.append(key))
    # a: plain, capture + replay, replay; b: plain; a: replay; b: plain (not a repeat), capture + replay, replay
    assert log == ["capture", "replay", "replay", "replay", "capture", "replay", "replay"]
    assert calls == list(keys)   # every call's work done exactly once
    assert (cache.captures, cache.replays) == (2, 5)


def test_keys_that_never_repeat_back_to_back_are_never_captured():
    log = []
    cache = fake_cache(log)
    for key in ("a", "b", "a", "b", "c", "a"):
        cache.run(key, lambda: None)
    assert log == [] and cache.captures == 0


def test_the_least_recently_used_graph_goes_first():
    log = []
    cache = fake_cache(log, capacity=2)
    for key in ("a", "a", "b", "b", "a", "c", "c"):   # a used after b: b is dropped when c comes
        cache.run(key, lambda: None)
    assert list(cache._graphs) == ["a", "c"]


def test_a_failed_capture_launches_plainly_and_says_why():
    log = []
    cache = fake_cache(log, fail=True)
    calls = []
    for _ in range(3):
        cache.run("a", lambda: calls.append(1))
    assert calls == [1, 1, 1] and cache.captures == 0 and len(cache.errors) == 1
    assert "capturing" in cache.errors[0]


def test_graphs_are_never_used_on_the_cpu(monkeypatch):
    monkeypatch.setattr(graph_replay, "ENABLED", True)
    assert not graph_replay.usable(torch.zeros(1))


def test_graphs_are_off_unless_asked_for(monkeypatch):
    import importlib
    try:
        monkeypatch.delenv("H3BENCH_GRAPHS", raising=False)
        assert importlib.reload(graph_replay).ENABLED is False
        monkeypatch.setenv("H3BENCH_GRAPHS", "1")
        assert importlib.reload(graph_replay).ENABLED is True
    finally:
        monkeypatch.undo()
        importlib.reload(graph_replay)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _plain(monkeypatch, op, *args, **kwargs):
    """`op(*args, **kwargs)` with the graph replay off: the plain launches' result."""
    with monkeypatch.context() as m:
        m.setattr(graph_replay, "ENABLED", False)
        return op(*args, **kwargs)


@cuda
@pytest.mark.parametrize("rows", [1, 8])
def test_replayed_forward_gives_the_plain_bits_and_follows_its_inputs(rows, monkeypatch):
    from kernels import timestep_mlp as TM
    monkeypatch.setattr(graph_replay, "ENABLED", True)
    inputs, _ = mlp_case(torch.device("cuda"), rows)
    x, w1, b1, w2, b2 = (inputs.tensors[n].detach() for n in MLP_NAMES)
    TM._GRAPHS.clear()
    with torch.no_grad():
        want = _plain(monkeypatch, TM.timestep_mlp, x, w1, b1, w2, b2)
        before = TM._GRAPHS.replays
        for _ in range(4):   # a loop dropping its output: the same blocks come back, the key repeats
            got = TM.timestep_mlp(x, w1, b1, w2, b2)
            assert torch.equal(as_bits(got), as_bits(want))
            del got
        assert TM._GRAPHS.captures >= 1 and TM._GRAPHS.replays > before
        x.mul_(0.5)   # new contents at the same address: the replay reads them
        w2.add_(1e-3)
        want = _plain(monkeypatch, TM.timestep_mlp, x, w1, b1, w2, b2)
        replays = TM._GRAPHS.replays
        for _ in range(4):   # `want` now holds a block: the output's address (a key part) settles anew
            got = TM.timestep_mlp(x, w1, b1, w2, b2)
            assert torch.equal(as_bits(got), as_bits(want))
            del got
        assert TM._GRAPHS.replays > replays   # and a replay read the new contents
        kept = [TM.timestep_mlp(x, w1, b1, w2, b2) for _ in range(3)]   # outputs kept: each its own block
        assert len({k.data_ptr() for k in kept}) == 3
        for k in kept:
            assert torch.equal(as_bits(k), as_bits(want))


@cuda
def test_inside_a_callers_capture_the_launches_join_its_graph(monkeypatch):
    from kernels import timestep_mlp as TM
    monkeypatch.setattr(graph_replay, "ENABLED", True)
    inputs, _ = mlp_case(torch.device("cuda"), 3)
    x, w1, b1, w2, b2 = (inputs.tensors[n].detach() for n in MLP_NAMES)
    TM._GRAPHS.clear()
    captures = TM._GRAPHS.captures   # the counters run on across clear(): earlier tests' captures count
    with torch.no_grad():
        want = _plain(monkeypatch, TM.timestep_mlp, x, w1, b1, w2, b2)
        TM.timestep_mlp(x, w1, b1, w2, b2)
        outer = torch.cuda.CUDAGraph()
        with torch.cuda.graph(outer):
            got = TM.timestep_mlp(x, w1, b1, w2, b2)
        outer.replay()
        torch.cuda.synchronize()
    assert TM._GRAPHS.captures == captures
    assert torch.equal(as_bits(got), as_bits(want))


@cuda
def test_norm_modulate_inference_replays_with_the_plain_bits(monkeypatch):
    from kernels import norm_modulate_api as api
    monkeypatch.setattr(graph_replay, "ENABLED", True)
    g = torch.Generator(device="cuda").manual_seed(2)
    rows, hidden, table = 4097, 5376, 9
    x = torch.randn(rows, hidden, generator=g, device="cuda").bfloat16()
    w = torch.randn(hidden, generator=g, device="cuda").bfloat16()
    sh, sc = (torch.randn(table, hidden, generator=g, device="cuda").bfloat16() for _ in range(2))
    idx = torch.randint(0, table, (rows,), generator=g, device="cuda")
    api._GRAPHS.clear()

    with torch.no_grad():
        want = _plain(monkeypatch, api.norm_modulate, x, w, sh, sc, idx, check_index=False)
        for _ in range(4):
            got = api.norm_modulate(x, w, sh, sc, idx, check_index=False)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
            del got
        assert api._GRAPHS.captures >= 1 and api._GRAPHS.replays >= 2
        sc.mul_(0.5)   # the table's new contents, the same address: the replay reads them
        want = _plain(monkeypatch, api.norm_modulate, x, w, sh, sc, idx, check_index=False)
        got = api.norm_modulate(x, w, sh, sc, idx, check_index=False)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))

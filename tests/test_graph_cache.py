"""kernels/graph_cache.py: when a call's launches are captured and replayed, and (on a GPU) that a
replayed timestep_mlp forward gives the plain launches' bits and follows its inputs' contents."""
import pytest
import torch

from h3bench.kernels import graph_cache
from h3bench.kernels.graph_cache import GraphCache

from tests.test_kernel_gemm import MLP_NAMES, as_bits, mlp_case
from tests.helpers import needs_cuda


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


def test_graphs_are_never_used_on_the_cpu():
    cache = GraphCache(on_by_default=True)
    assert cache.on and not cache.usable(torch.zeros(1))
    assert cache.described(torch.device("cpu")) == ""


@pytest.mark.parametrize("env, default, on", [(None, False, False), (None, True, True), ("", True, True),
                                              ("0", True, False), ("1", False, True), (" 1 ", False, True)])
def test_each_cache_takes_its_default_unless_the_environment_says(env, default, on, monkeypatch):
    if env is None:
        monkeypatch.delenv("H3BENCH_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("H3BENCH_GRAPHS", env)
    cache = GraphCache(on_by_default=default)
    assert cache.on is on
    assert bool(cache.described(torch.device("cuda"))) is on   # the row's source says so when on


@pytest.mark.parametrize("env", ["yes", "true", "2", "off"])
def test_a_value_other_than_0_or_1_is_refused_by_name(env, monkeypatch):
    monkeypatch.setenv("H3BENCH_GRAPHS", env)
    with pytest.raises(ValueError, match="H3BENCH_GRAPHS must be 0 or 1"):
        GraphCache()


def test_the_ops_defaults_are_as_measured():
    """Both no-grad forwards replay by default: timestep_mlp's (15-16 us a call at T <= 8 on the H200) and
    norm_modulate's (1-5 us at R = 4097, in two runs); H3BENCH_GRAPHS, when set at import, overrides both (the
    test above)."""
    from h3bench.kernels import norm_modulate_api, timestep_mlp_kernel as timestep_mlp
    assert (timestep_mlp.GRAPHS.on_by_default, norm_modulate_api.GRAPHS.on_by_default) == (True, True)
    assert timestep_mlp.GRAPH_MAX_ROWS == 64


def test_no_graph_above_the_row_limit(device, monkeypatch):
    """Above GRAPH_MAX_ROWS the no-grad forward launches plainly (a graph would keep its intermediates)."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    seen = []
    monkeypatch.setattr(TM.GRAPHS, "usable", lambda t: True)
    monkeypatch.setattr(TM.GRAPHS, "run", lambda key, launch: (seen.append(key), launch()))
    monkeypatch.setattr(graph_cache, "placed", lambda device, *tensors: tuple(t.data_ptr() for t in tensors))
    inputs, _ = mlp_case(device, 3)
    x, w1, b1, w2, b2 = (inputs.tensors[n].detach() for n in MLP_NAMES)
    monkeypatch.setattr(TM, "GRAPH_MAX_ROWS", 2)
    with torch.no_grad():
        timestep_mlp(x, w1, b1, w2, b2)
        assert seen == []
        monkeypatch.setattr(TM, "GRAPH_MAX_ROWS", 3)
        timestep_mlp(x, w1, b1, w2, b2)
    assert len(seen) == 1


cuda = needs_cuda("CUDA graphs need a CUDA device")


def _plain(monkeypatch, cache, op, *args, **kwargs):
    """`op(*args, **kwargs)` with the graph replay off: the plain launches' result."""
    with monkeypatch.context() as m:
        m.setattr(cache, "on", False)
        return op(*args, **kwargs)


@cuda
@pytest.mark.parametrize("rows", [1, 8])
def test_replayed_forward_gives_the_plain_bits_and_follows_its_inputs(rows, monkeypatch):
    from h3bench.kernels import timestep_mlp_kernel as TM
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    monkeypatch.setattr(TM.GRAPHS, "on", True)
    inputs, _ = mlp_case(torch.device("cuda"), rows)
    x, w1, b1, w2, b2 = (inputs.tensors[n].detach() for n in MLP_NAMES)
    TM.GRAPHS.clear()
    with torch.no_grad():
        want = _plain(monkeypatch, TM.GRAPHS, timestep_mlp, x, w1, b1, w2, b2)
        before = TM.GRAPHS.replays
        for _ in range(4):   # a loop dropping its output: the same blocks come back, the key repeats
            got = timestep_mlp(x, w1, b1, w2, b2)
            assert torch.equal(as_bits(got), as_bits(want))
            del got
        assert TM.GRAPHS.captures >= 1 and TM.GRAPHS.replays > before
        x.mul_(0.5)   # new contents at the same address: the replay reads them
        w2.add_(1e-3)
        want = _plain(monkeypatch, TM.GRAPHS, timestep_mlp, x, w1, b1, w2, b2)
        replays = TM.GRAPHS.replays
        for _ in range(4):   # `want` now holds a block: the output's address (a key part) settles anew
            got = timestep_mlp(x, w1, b1, w2, b2)
            assert torch.equal(as_bits(got), as_bits(want))
            del got
        assert TM.GRAPHS.replays > replays   # and a replay read the new contents
        kept = [timestep_mlp(x, w1, b1, w2, b2) for _ in range(3)]   # outputs kept: each its own block
        assert len({k.data_ptr() for k in kept}) == 3
        for k in kept:
            assert torch.equal(as_bits(k), as_bits(want))


@cuda
def test_inside_a_callers_capture_the_launches_join_its_graph(monkeypatch):
    from h3bench.kernels import timestep_mlp_kernel as TM
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    monkeypatch.setattr(TM.GRAPHS, "on", True)
    inputs, _ = mlp_case(torch.device("cuda"), 3)
    x, w1, b1, w2, b2 = (inputs.tensors[n].detach() for n in MLP_NAMES)
    TM.GRAPHS.clear()
    captures = TM.GRAPHS.captures   # the counters run on across clear(): earlier tests' captures count
    with torch.no_grad():
        want = _plain(monkeypatch, TM.GRAPHS, timestep_mlp, x, w1, b1, w2, b2)
        timestep_mlp(x, w1, b1, w2, b2)
        outer = torch.cuda.CUDAGraph()
        with torch.cuda.graph(outer):
            got = timestep_mlp(x, w1, b1, w2, b2)
        outer.replay()
        torch.cuda.synchronize()
    assert TM.GRAPHS.captures == captures
    assert torch.equal(as_bits(got), as_bits(want))


@cuda
def test_norm_modulate_inference_replays_with_the_plain_bits(monkeypatch):
    from h3bench.kernels import norm_modulate_api as api
    monkeypatch.setattr(api.GRAPHS, "on", True)
    g = torch.Generator(device="cuda").manual_seed(2)
    rows, hidden, table = 4097, 5376, 9
    x = torch.randn(rows, hidden, generator=g, device="cuda").bfloat16()
    w = torch.randn(hidden, generator=g, device="cuda").bfloat16()
    sh, sc = (torch.randn(table, hidden, generator=g, device="cuda").bfloat16() for _ in range(2))
    idx = torch.randint(0, table, (rows,), generator=g, device="cuda")
    api.GRAPHS.clear()

    with torch.no_grad():
        want = _plain(monkeypatch, api.GRAPHS, api.norm_modulate, x, w, sh, sc, idx, check_index=False)
        for _ in range(4):
            got = api.norm_modulate(x, w, sh, sc, idx, check_index=False)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
            del got
        assert api.GRAPHS.captures >= 1 and api.GRAPHS.replays >= 2
        sc.mul_(0.5)   # the table's new contents, the same address: the replay reads them
        want = _plain(monkeypatch, api.GRAPHS, api.norm_modulate, x, w, sh, sc, idx, check_index=False)
        got = api.norm_modulate(x, w, sh, sc, idx, check_index=False)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))

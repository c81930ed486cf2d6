"""kernels.plan: the global plan (rows sorted stably by clamped table row) against torch's stable sort."""
import pytest
import torch

from h3bench.kernels.plan import make_plan


def _expected(idx, table_rows):
    clamped = idx.long().clamp(-1, table_rows)
    keys, order = torch.sort(clamped, stable=True)
    return keys, order


@pytest.mark.parametrize("rows,table_rows,block,pattern", [
    (1, 1, 8, "random"), (7, 3, 8, "random"), (8, 3, 8, "random"), (37, 5, 8, "random"),   # partial last block
    (100, 300, 16, "random"),          # M > R: most table rows unused
    (64, 40, 16, "one row"),           # every row one table row: one run across every block
    (64, 40, 16, "sorted"), (64, 40, 16, "descending"),
    (50, 9, 16, "bad"),                # indices < 0 and >= M: their own groups, first and last
    (300, 4096, 64, "random"),         # many buckets: COUNTS zeroed over several chunks
    (1000, 70, 8, "random"),           # 125 blocks: the scan's column walks more than one tile
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_plan_is_the_stable_sort_of_the_clamped_rows(device, rows, table_rows, block, pattern, dtype):
    g = torch.Generator().manual_seed(rows * 31 + table_rows)
    if pattern == "one row":
        idx = torch.full((rows,), 7)
    elif pattern == "sorted":
        idx = torch.arange(rows) * table_rows // rows
    elif pattern == "descending":
        idx = (torch.arange(rows) * table_rows // rows).flip(0)
    elif pattern == "bad":
        idx = torch.randint(-3, table_rows + 3, (rows,), generator=g)
    else:
        idx = torch.randint(0, table_rows, (rows,), generator=g)
    idx = idx.to(dtype).to(device)
    keys, order = make_plan(idx, table_rows, block=block)
    want_keys, want_order = _expected(idx.cpu(), table_rows)
    assert keys.dtype == torch.int64 and order.dtype == torch.int64
    assert torch.equal(order.cpu(), want_order), (order.cpu(), want_order)
    assert torch.equal(keys.cpu(), want_keys)


def test_empty_default_block_and_counter_bound(device):
    from h3bench.kernels import plan
    keys, order = make_plan(torch.empty(0, dtype=torch.long, device=device), 9)
    assert keys.shape == (0,) and order.shape == (0,) and keys.dtype == order.dtype == torch.int64
    idx = torch.randint(-2, 70, (300,)).to(device)
    assert plan.plan_block(300, 64) == plan.BLOCK
    assert torch.equal(make_plan(idx, 64)[1].cpu(), _expected(idx.cpu(), 64)[1])
    # the counters stay bounded: blocks grow with M, then torch's sort takes over
    assert plan.plan_block(32768, 4096) == plan.BLOCK
    assert plan.plan_block(32768, 20000) == 2 * plan.BLOCK
    assert plan.plan_block(32768, 10 ** 7) == 0
    # a place program adds every earlier scan chunk's sum for its rows: past PLACE_WORK comparisons torch's
    # sort takes over
    assert plan.plan_block(4096, 60000) == plan.BLOCK
    assert plan.plan_block(1024, 10 ** 5) == plan.BLOCK
    assert plan.plan_block(1024, 3 * 10 ** 6) == 0   # 1024-row blocks, 93751 chunk sums each: past PLACE_WORK
    keys, order = make_plan(idx, 10 ** 7)   # torch's sort: the same plan
    assert torch.equal(order.cpu(), _expected(idx.cpu(), 10 ** 7)[1])
    assert torch.equal(keys.cpu(), _expected(idx.cpu(), 10 ** 7)[0])

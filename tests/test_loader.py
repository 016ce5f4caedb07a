"""ResumableLoader sharding: disjoint rank shares covering every epoch, the same number of steps on every
rank, one-process order kept, and exact mid-epoch resume per rank."""

import pytest

from arbor_train.data import ResumableLoader


def shares(n, world, bs, epoch=0, **kw):
    loaders = [ResumableLoader(list(range(n)), bs, list, seed=7, rank=r, world_size=world, **kw) for r in range(world)]
    return [l.batches(epoch) for l in loaders]


@pytest.mark.parametrize("n", [2, 3, 7, 16, 17, 31, 100])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("bs", [1, 2, 5])
def test_rank_shares_are_disjoint_cover_the_epoch_and_keep_step_counts_equal(n, world, bs):
    if n < world:
        with pytest.raises(ValueError, match="every rank needs at least one"):
            shares(n, world, bs)
        return
    for epoch in (0, 1):
        s = shares(n, world, bs, epoch)
        flat = [i for rank in s for b in rank for i in b]
        assert sorted(flat) == list(range(n)), "every example exactly once per epoch"
        assert len({len(rank) for rank in s}) == 1, "every rank makes the same number of steps"
        assert all(b and len(b) <= bs + 1 for rank in s for b in rank)
        single = shares(n, 1, bs, epoch)[0]
        for k in range(len(s[0]) - 1):   # rank r's k-th batch is the one-process run's (k * world + r)-th
            assert [s[r][k] for r in range(world)] == single[k * world : (k + 1) * world]
    if n >= 7:   # (a 3-item epoch can repeat its order by chance)
        assert shares(n, world, bs, 0) != shares(n, world, bs, 1), "reshuffled every epoch"


def test_drop_last_drops_the_short_global_batch_and_world_one_is_unchanged():
    s = shares(17, 2, 4, drop_last=True)
    assert [len(b) for b in s[0]] == [4, 4] and not set(sum(s[0], [])) & set(sum(s[1], []))
    one = ResumableLoader(list(range(10)), 4, list, seed=0, shuffle=False, shard=False)
    assert one.batches(0) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_mid_epoch_state_resumes_every_rank_with_its_next_batch():
    ranks = [ResumableLoader(list(range(40)), 3, list, seed=1, rank=r, world_size=2) for r in range(2)]
    its = [iter(l) for l in ranks]
    seen = [[next(it) for _ in range(4)] for it in its]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() == {"epoch": 0, "consumed": 4}   # rank 0's checkpoint fits every rank
    rest = [list(it) for it in its]
    for r in range(2):
        fresh = ResumableLoader(list(range(40)), 3, list, seed=1, rank=r, world_size=2)
        fresh.load_state_dict(state)
        assert list(fresh) == rest[r] and seen[r] + rest[r] == [[i for i in b] for b in ranks[r].batches(0)]

"""`DraftKVBacklog`: root-alone rounds' draft-KV rows, held and written later, leave the draft KV
as writing every round at once does, wherever a read may come (the served worker's use:
tests_sglang/test_serving_cpu.py::test_batch_node_budget_shrinks_trees_as_the_batch_grows)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.srt.draft_kv_backlog import DraftKVBacklog

SLOTS, DIM = 24, 5


class DraftKV:
    """A draft KV of ``SLOTS`` rows with SGLang's prefix-valid writer's contract: row ``j < commit_lens[b]``
    of request ``b`` goes to ``cache_loc_2d[b, j]``, as the position-dependent projection of its features."""

    def __init__(self) -> None:
        self.kv = torch.zeros(SLOTS, DIM)
        self.calls = 0
        self.proj = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(0))

    def __call__(self, *, target_hidden, cache_loc, positions, cache_loc_2d, commit_lens) -> None:
        self.calls += 1
        bs, k = cache_loc_2d.shape
        assert target_hidden.shape == (bs * k, DIM) and torch.equal(cache_loc, cache_loc_2d.reshape(-1))
        rows = (target_hidden @ self.proj + positions[:, None]).view(bs, k, DIM)
        live = torch.arange(k)[None, :] < commit_lens[:, None]
        self.kv[cache_loc_2d[live]] = rows[live]


# one step of a server: a root-alone round of some requests, or something that reads the draft KV
step = st.one_of(
    st.tuples(st.just("round"), st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True)),
    st.tuples(st.just("read"), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=30), cap_rows=st.sampled_from([0, 1, 3, 1000]),
       seed=st.integers(0, 2**16))
def test_every_read_sees_what_writing_at_once_wrote(steps, cap_rows, seed):
    """Requests take fresh slots while they live and a finished request's slots go back to the
    pool (a later request may write the same slot), and every read finds the draft KV of
    eager writes: rows written in round order, a reused slot holding its last owner's row."""
    gen = torch.Generator().manual_seed(seed)
    eager, held = DraftKV(), DraftKV()
    backlog = DraftKVBacklog(held, max_bytes=cap_rows * DIM * 4)
    free = list(range(SLOTS))
    owned: dict[str, list[int]] = {}
    rounds = 0
    for kind, rids in steps:
        if kind == "read":  # a drafting round, a prefill, any call that is not a root-alone round
            backlog.flush()
            assert torch.equal(held.kv, eager.kv)
            continue
        for rid in list(owned):  # requests not in this batch finished: their slots are freed
            if rid not in rids:
                free.extend(owned.pop(rid))
        if any(len(owned.get(r, [])) == 0 for r in rids) or len(free) < len(rids):
            backlog.flush()  # a new request's prefill runs first (it writes its own rows)
        loc = []
        for rid in rids:
            if not free:  # the pool is full: the oldest request is retracted
                backlog.flush()
                victim = next(iter(owned))
                free.extend(owned.pop(victim))
            loc.append(free.pop(0))
            owned.setdefault(rid, []).append(loc[-1])
        hidden = torch.randn(len(rids), DIM, generator=gen)
        positions = torch.tensor([len(owned[r]) for r in rids])
        loc_t = torch.tensor(loc)
        eager(target_hidden=hidden, cache_loc=loc_t, positions=positions, cache_loc_2d=loc_t[:, None],
              commit_lens=torch.ones(len(rids), dtype=torch.int32))
        backlog.hold(tuple(rids), hidden, loc_t, positions)
        rounds += 1
    backlog.flush()
    assert torch.equal(held.kv, eager.kv)
    assert held.calls <= rounds and backlog.rounds == 0


def test_one_batchs_rounds_are_written_in_one_call():
    """A run of root-alone rounds of one batch: one writer call at the next read, request-major rows."""
    kv = DraftKV()
    backlog = DraftKVBacklog(kv)
    for r in range(6):
        backlog.hold(("a", "b"), torch.full((2, DIM), float(r)), torch.tensor([r, 12 + r]), torch.tensor([r, r]))
    assert kv.calls == 0 and backlog.rounds == 6
    backlog.flush()
    assert kv.calls == 1 and backlog.rounds == 0
    backlog.flush()  # nothing held: no call
    assert kv.calls == 1
    backlog.hold(("a", "b"), torch.ones(2, DIM), torch.tensor([6, 18]), torch.tensor([6, 6]))
    backlog.hold(("a", "c"), torch.ones(2, DIM), torch.tensor([7, 19]), torch.tensor([7, 0]))  # another batch
    assert kv.calls == 2 and backlog.rounds == 1


def test_the_cap_writes_what_it_holds():
    """Past ``max_bytes`` of held features the backlog writes them; 0 writes every round at once."""
    kv = DraftKV()
    backlog = DraftKVBacklog(kv, max_bytes=3 * 2 * DIM * 4)  # three rounds of two float32 rows
    for r in range(7):
        backlog.hold(("a", "b"), torch.zeros(2, DIM), torch.tensor([r, 12 + r]), torch.tensor([r, r]))
    assert kv.calls == 2 and backlog.rounds == 1
    eager = DraftKV()
    at_once = DraftKVBacklog(eager, max_bytes=0)
    at_once.hold(("a",), torch.zeros(1, DIM), torch.tensor([0]), torch.tensor([0]))
    assert eager.calls == 1 and at_once.rounds == 0
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        DraftKVBacklog(kv, max_bytes=-1)

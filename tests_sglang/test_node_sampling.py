"""Sampled and penalised REANCHOR requests inside SGLang on CPU, against plain SGLang and the target.

- penalties (frequency, presence, repetition) and logit bias at T=0: tokens equal
  plain SGLang's, on the tiny pair whose rounds accept through shifted rows (so
  nodes deep in the tree are scored with their own path's history);
- `filtered_probs` equals SGLang's own sampler filtering (top-k, top-p, min-p);
- min_p and a frequency penalty at T=1: the empirical distribution of three
  tokens equals the one computed from the target;
- a custom logit processor is refused on arrival, and the server goes on.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from test_serving_cpu import PROMPTS, pair, serve  # noqa: F401  (pair: the module fixture)

from sglang_reanchor.sampling import filtered_probs

OFFSET = '{"policy": "offset"}'  # this pair accepts through shifted rows under the offset policy

PENALISED = {
    "freq": {"frequency_penalty": 0.9},
    "pres": {"presence_penalty": 1.1},
    "rep": {"repetition_penalty": 1.4},
    "freq+pres": {"frequency_penalty": 0.5, "presence_penalty": 0.5},
    "bias": {"logit_bias": {"9": 1.0, "17": -100.0}},
}  # min_new_tokens needs a tokenizer (SGLang refuses it with skip_tokenizer_init): tests/test_penalties.py


def test_penalised_requests_equal_plain_sglang(pair, tmp_path):
    root, _, _ = pair
    batch = []
    for (name, sampling), (key, (prompt, n)) in zip(PENALISED.items(), itertools.cycle(PROMPTS.items())):
        batch.append({"rid": f"{name}-{key}", "input_ids": prompt, "max_new_tokens": 24, "sampling": sampling})
    batch.append({"rid": "neutral", "input_ids": PROMPTS["a"][0], "max_new_tokens": 24})
    trace = tmp_path / "trace.jsonl"
    plain = serve(root, "NONE", [batch], None, None, engine_args={"disable_overlap_schedule": True})
    spec = serve(root, "REANCHOR", [batch], OFFSET, trace)
    for r in batch:
        assert spec[r["rid"]]["output_ids"] == plain[r["rid"]]["output_ids"], r["rid"]
    unpenalised = serve(root, "NONE", [[{**r, "sampling": {}} for r in batch]], None, None)
    changed = [r["rid"] for r in batch if unpenalised[r["rid"]]["output_ids"] != plain[r["rid"]]["output_ids"]]
    assert len(changed) >= len(PENALISED) - 1, changed  # the penalties do change these outputs
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert sum(row["shifted_accepts"] for row in rows) > 0  # accepted paths ran through shifted rows
    assert max(row["tau"] for row in rows) >= 3  # ... and deep: nodes below the root's child were scored


@pytest.mark.parametrize("seed", range(6))
def test_filtered_probs_equals_sglangs_sampler(seed):
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    gen = torch.Generator().manual_seed(seed)
    rows, vocab = 7, 50
    logits = torch.randn(rows, vocab, generator=gen) * 2
    temperature = torch.rand(rows, generator=gen) + 0.3
    top_k = torch.randint(1, vocab + 1, (rows,), generator=gen)
    top_p = torch.where(torch.rand(rows, generator=gen) < 0.5, torch.ones(rows), torch.rand(rows, generator=gen))
    min_p = torch.where(torch.rand(rows, generator=gen) < 0.5, torch.zeros(rows), torch.rand(rows, generator=gen) * 0.5)
    probs = (logits / temperature[:, None]).softmax(-1)
    _, weights, order, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_k.int(), top_p, min_p, True, None, torch.zeros(rows, dtype=torch.long),
        return_filtered_probs=True,
    )
    want = torch.zeros_like(probs).scatter(1, order.long(), weights)
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(filtered_probs(logits, temperature, top_k, top_p, min_p), want)


def test_min_p_and_penalty_sample_the_targets_distribution(pair, tmp_path):
    """400 requests at T=1, min_p=0.6, frequency_penalty=1.5: tokens 1..3 against the exact law.

    The support must be the law's; the marginals of tokens 2 and 3 (drawn by the
    worker, token 1 by SGLang's prefill) must be within sampling noise of it.
    """
    root, target, _ = pair
    prompt = PROMPTS["a"][0]
    sampling = {"min_p": 0.6, "frequency_penalty": 1.5}
    n = 400
    batch = [{"rid": f"s{i}", "input_ids": prompt, "max_new_tokens": 3, "temperature": 1.0, "sampling": sampling}
             for i in range(n)]
    # room for all 300 at once: a request retracted for memory is re-prefilled, and SGLang's
    # prefill sampler starts its penalty state afresh (as it does without speculation)
    trace = tmp_path / "trace.jsonl"
    got = serve(root, "REANCHOR", [batch], OFFSET, trace, engine_args={"max_total_tokens": 65536})
    rounds = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {row["rid"] for row in rounds} == {r["rid"] for r in batch}  # every request went through the tree
    seen: dict[tuple, int] = {}
    for r in batch:
        key = tuple(got[r["rid"]]["output_ids"])
        seen[key] = seen.get(key, 0) + 1

    def step(ids: list[int], output: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = target(torch.tensor([ids])).logits[0, -1].double()
        logits = logits - 1.5 * torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.shape[0])
        probs = logits.softmax(-1)
        probs = torch.where(probs < 0.6 * probs.max(), 0.0, probs)
        return probs / probs.sum()

    law: dict[tuple, float] = {}
    p1 = step(prompt, [])
    for t1 in p1.nonzero().flatten().tolist():
        p2 = step(prompt + [t1], [t1])
        for t2 in p2.nonzero().flatten().tolist():
            p3 = step(prompt + [t1, t2], [t1, t2])
            for t3 in p3.nonzero().flatten().tolist():
                law[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    assert set(seen) <= set(law), set(seen) - set(law)  # nothing outside the support
    for k in (1, 2):
        want: dict[int, float] = {}
        for key, p in law.items():
            want[key[k]] = want.get(key[k], 0.0) + p
        got_k: dict[int, float] = {}
        for key, c in seen.items():
            got_k[key[k]] = got_k.get(key[k], 0.0) + c / n
        assert len(want) > 2  # the test has something to tell apart
        tv = 0.5 * sum(abs(got_k.get(t, 0.0) - p) for t, p in want.items())
        assert tv < 0.1, (k, tv, got_k, want)  # sampling noise at n=400 over a few tokens: ~0.04


def test_custom_logit_processor_is_refused_and_the_server_goes_on(pair):
    root, _, _ = pair
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    rounds = [
        [{"rid": "custom", "input_ids": PROMPTS["a"][0], "max_new_tokens": 4,
          "custom_logit_processor": DisallowedTokensLogitsProcessor().to_str(),
          "sampling": {"custom_params": {"token_ids": [5]}}}],
        [{"rid": "after", "input_ids": PROMPTS["c"][0], "max_new_tokens": 8}],
    ]
    got = serve(root, "REANCHOR", rounds, None, None, engine_args={"enable_custom_logit_processor": True})
    assert "custom_logit_processor" in got["custom"]["error"], got["custom"]
    assert len(got["after"]["output_ids"]) == 8


def test_seeded_node_picks_ignore_the_batch_around_them():
    """The worker's seeded draw (SGLang's own SamplingBatchInfo, as under deterministic inference)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from sglang_reanchor.sampling import seeded_draw
    from sglang_reanchor.srt.node_sampling import node_picks

    bs, width, vocab = 3, 5, 40
    logits = torch.randn(bs, width, vocab, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(width)[None].repeat(bs, 1) + torch.tensor([[7], [3], [7]])

    def info(rows):
        n = len(rows)
        return SamplingBatchInfo(
            temperatures=torch.full((n, 1), 0.9), top_ps=torch.full((n,), 0.95),
            top_ks=torch.full((n,), 1 << 30, dtype=torch.int32), min_ps=torch.full((n,), 0.05),
            is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=True, need_top_k_sampling=False,
            need_min_p_sampling=True, vocab_size=vocab, sampling_seed=torch.tensor([11, 12, 11])[rows],
        )

    batch = node_picks(logits, positions, info([0, 1, 2]), None)
    alone = node_picks(logits[1:2], positions[1:2], info([1]), None)
    assert torch.equal(batch[1], alone[0])  # the batch around a request does not change its draws
    probs = filtered_probs(logits[0], torch.full((width,), 0.9), torch.full((width,), vocab),
                           torch.full((width,), 0.95), torch.full((width,), 0.05))
    assert torch.equal(batch[0], seeded_draw(probs, torch.full((width,), 11), positions[0]))
    assert not torch.equal(batch[0], batch[1])


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="SGLang's --enable-deterministic-inference needs CUDA/XPU (batch-invariant ops)")
def test_a_seeded_request_is_reproducible_whatever_the_batch_and_the_tree(pair):
    """Under --enable-deterministic-inference (where plain SGLang honours sampling_seed): the same tokens
    alone or batched, from offset trees, DFlash's chain and trees cut by confidence."""
    root, _, _ = pair
    prompt = PROMPTS["a"][0]

    def req(rid, seed, ids=prompt):
        return {"rid": rid, "input_ids": ids, "max_new_tokens": 20, "temperature": 1.0,
                "sampling": {"sampling_seed": seed}}

    rounds = [[req("alone", 7)],
              [req("batched", 7), req("other", 8, PROMPTS["b"][0]), {"rid": "greedy", "input_ids": PROMPTS["c"][0],
                                                                    "max_new_tokens": 9}],
              [req("seed8", 8)]]
    engine = {"enable_deterministic_inference": True}
    tree = serve(root, "REANCHOR", rounds, OFFSET, None, engine_args=engine)
    chain = serve(root, "REANCHOR", rounds, '{"offsets": []}', None, engine_args=engine)  # DFlash's chain
    cut = serve(root, "REANCHOR", rounds, OFFSET[:-1] + ', "verify_threshold": 0.05}', None,  # trees cut by confidence
                engine_args=engine)
    assert tree["alone"]["output_ids"] == tree["batched"]["output_ids"] == chain["alone"]["output_ids"]
    assert cut["alone"]["output_ids"] == cut["batched"]["output_ids"] == tree["alone"]["output_ids"]
    assert tree["seed8"]["output_ids"] != tree["alone"]["output_ids"]


def test_emitted_support_is_the_distribution_each_token_was_drawn_from():
    """`emitted_support` (return_sampling_mask): for rows that `node_picks` draws, every token it
    can pick is in the support, the support's probabilities sum to one, and a greedy request's
    support is its token alone (logprob 0)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from sglang_reanchor.srt.node_sampling import emitted_support, node_picks

    bs, width, vocab, top_k = 3, 4, 50, 10
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(bs, width, vocab, generator=gen) * 3
    info = SamplingBatchInfo(
        temperatures=torch.tensor([[1.0], [0.7], [1.0]]), top_ps=torch.tensor([0.9, 1.0, 1.0]),
        top_ks=torch.tensor([top_k, top_k, 1], dtype=torch.int32), min_ps=torch.tensor([0.0, 0.05, 0.0]),
        is_all_greedy=False, is_any_greedy=True, need_top_p_sampling=True, need_top_k_sampling=True,
        need_min_p_sampling=True, vocab_size=vocab,
    )
    rows = torch.tensor([0, 1, 2])
    draws = torch.stack([node_picks(logits, torch.zeros(bs, width, dtype=torch.long), info,
                                    torch.Generator().manual_seed(s)) for s in range(200)])  # [200, bs, N]
    support, logprobs, lengths = emitted_support(logits, draws[0], info, rows, max_support=top_k)
    assert support.shape == (bs, width, top_k) and lengths.dtype == torch.int32
    for b in range(2):  # sampled rows
        for i in range(width):
            keep = support[b, i, : lengths[b, i]].tolist()
            assert set(draws[:, b, i].tolist()) <= set(keep)
            assert abs(logprobs[b, i, : lengths[b, i]].exp().sum().item() - 1) < 1e-5
            assert torch.isinf(logprobs[b, i, lengths[b, i]:]).all()
    assert lengths[0].max() < top_k  # top_p 0.9 cut into the top 10 ...
    assert (lengths[2] == 1).all() and torch.equal(support[2, :, 0].long(), logits[2].argmax(-1))  # greedy
    assert (logprobs[2, :, 0] == 0).all()

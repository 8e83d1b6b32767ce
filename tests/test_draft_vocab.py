"""Drafting over a reduced vocabulary (`DraftVocabHead`): drafts from the subset only,
the same drafts when the subset is everything, and the output stays the target's."""

from __future__ import annotations

import random

import pytest
import torch
from factories import tiny_drafter, tiny_target, write_zlab_drafter
from test_engine_lossless import hf_greedy, make_case

from sglang_reanchor import DFlashDrafter, ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.bench.methods import MethodSpec
from sglang_reanchor.drafter import (DraftContextCache, DraftVocabHead, draft_blocks, draft_hidden, load_draft_vocab,
                                     rank_tokens)
from sglang_reanchor.drafter.draft_vocab import DRAFT_VOCAB_FILE, top_tokens


def _blocks(target, drafter, head, anchors):
    cache = DraftContextCache()
    feats = torch.randn(1, 5, drafter.config.num_context_features, dtype=target.dtype,
                        generator=torch.Generator().manual_seed(1))
    cache.append(drafter.project_context(feats, torch.arange(5)[None]))
    return draft_blocks(drafter, cache, anchors=anchors, anchor_positions=torch.tensor([[5, 6, 7]]),
                        extra_features=None, extra_visible=torch.zeros(1, 3, dtype=torch.long),
                        embed_tokens=target.get_input_embeddings(), lm_head=head)


def test_drafts_are_the_argmax_over_the_subset() -> None:
    target = tiny_target("qwen3", vocab_size=32)
    drafter = tiny_drafter(target, block_size=6)
    lm_head = target.get_output_embeddings()
    anchors = torch.tensor([[3, 4, 5]])
    full = _blocks(target, drafter, lm_head, anchors)
    # every token, permuted: the same drafts as the full head
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_blocks(target, drafter, DraftVocabHead(lm_head, perm), anchors), full)
    # a subset: each draft is the best token of the subset under the full head's logits
    subset = perm[:9]
    got = _blocks(target, drafter, DraftVocabHead(lm_head, subset), anchors)
    assert torch.equal(got[..., 0], anchors)
    assert torch.isin(got[..., 1:], subset).all()
    with torch.no_grad():
        cache = DraftContextCache()
        feats = torch.randn(1, 5, drafter.config.num_context_features, dtype=target.dtype,
                            generator=torch.Generator().manual_seed(1))
        cache.append(drafter.project_context(feats, torch.arange(5)[None]))
        hidden = draft_hidden(drafter, cache, anchors, torch.tensor([[5, 6, 7]]), None,
                              torch.zeros(1, 3, dtype=torch.long), target.get_input_embeddings())
        logits = lm_head(hidden)[..., 1:, :]
    masked = torch.full_like(logits, -float("inf"))
    masked[..., subset] = logits[..., subset]
    assert torch.equal(got[..., 1:], masked.argmax(-1))


@pytest.mark.parametrize("case", range(0, 48, 4))
def test_output_with_a_reduced_draft_vocabulary_equals_hf_greedy(case, tmp_path) -> None:
    target, drafter, config, prompt, max_new = make_case(case, tmp_path)
    vocab = target.config.vocab_size
    keep = torch.randperm(vocab, generator=torch.Generator().manual_seed(case))[: random.Random(case).randint(1, vocab)]
    gen = SpeculativeGenerator(target, drafter, config, draft_vocab=keep)
    expected = hf_greedy(target, prompt, max_new)
    for method in ("dflash", "reanchor"):
        assert gen.generate(prompt, max_new, method=method).tokens == expected, (method, keep.tolist())


def test_ranking_counts_tokens_and_puts_the_required_ones_first() -> None:
    ids = torch.tensor([[5, 5, 5, 2, 2, 9], [9, 9, 9, 9, 7, 2]])
    assert rank_tokens(ids, 12).tolist() == [9, 2, 5, 7]  # 5 x 9, 3 x 2, 3 x 5 (lower id first), 1 x 7
    assert rank_tokens(ids, 12, always=(11,)).tolist() == [11, 9, 2, 5, 7]
    assert top_tokens(torch.tensor([4, 1, 0]), 2).tolist() == [4, 1]
    with pytest.raises(ValueError, match=r"draft_vocab size must be an int in \[1, 3\]"):
        top_tokens(torch.tensor([4, 1, 0]), 4)


def test_the_ranking_travels_with_the_drafter_folder(tmp_path) -> None:
    target = tiny_target("llama", vocab_size=16)
    drafter = tiny_drafter(target, block_size=4)
    folder = write_zlab_drafter(drafter, tmp_path / "plain")
    assert DFlashDrafter.from_pretrained(folder).vocab_ranking is None
    with pytest.raises(FileNotFoundError, match="draft-vocab"):
        load_draft_vocab(folder)
    drafter.vocab_ranking = torch.tensor([3, 7, 2])
    folder = write_zlab_drafter(drafter, tmp_path / "ranked")
    assert (folder / DRAFT_VOCAB_FILE).exists()
    loaded = DFlashDrafter.from_pretrained(folder)
    assert loaded.vocab_ranking.tolist() == [3, 7, 2]
    assert load_draft_vocab(folder, 2).tolist() == [3, 7]


def test_bad_vocabularies_and_specs_are_refused() -> None:
    head = tiny_target("llama", vocab_size=16).get_output_embeddings()
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 15\]"):
        DraftVocabHead(head, torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="twice"):
        DraftVocabHead(head, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="non-empty"):
        DraftVocabHead(head, torch.tensor([], dtype=torch.long))
    assert MethodSpec.parse("reanchor:draft_vocab=64,node_budget=20").draft_vocab == 64
    for bad in ("target:draft_vocab=64", "dflash:draft_vocab=0", "dflash:draft_vocab=x"):
        with pytest.raises(ValueError, match="draft_vocab"):
            MethodSpec.parse(bad)


def test_default_drafter_config_is_unchanged_without_a_vocabulary() -> None:
    target = tiny_target("llama", vocab_size=16)
    gen = SpeculativeGenerator(target, tiny_drafter(target, block_size=4), ReAnchorConfig())
    assert gen.draft_head is target.get_output_embeddings()


def test_the_config_field_drafts_from_the_drafters_own_ranking() -> None:
    """``ReAnchorConfig(draft_vocab=K)`` (what SGLang's worker reads) = ``draft_vocab=ranking[:K]``."""
    target = tiny_target("llama", vocab_size=16)
    drafter = tiny_drafter(target, block_size=4)
    with pytest.raises(ValueError, match="has no draft vocabulary"):
        SpeculativeGenerator(target, drafter, ReAnchorConfig(draft_vocab=4))
    drafter.vocab_ranking = torch.tensor([3, 7, 2, 9, 1])
    gen = SpeculativeGenerator(target, drafter, ReAnchorConfig(draft_vocab=3))
    assert gen.draft_head.token_ids.tolist() == [3, 7, 2]
    with pytest.raises(ValueError, match="not both"):
        SpeculativeGenerator(target, drafter, ReAnchorConfig(draft_vocab=3), draft_vocab=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"draft_vocab size must be an int in \[1, 5\]"):
        SpeculativeGenerator(target, drafter, ReAnchorConfig(draft_vocab=6))
    with pytest.raises(ValueError, match="ReAnchorConfig.draft_vocab must be None or an int >= 1"):
        ReAnchorConfig(draft_vocab=0)

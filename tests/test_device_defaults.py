"""Device defaults (`sglang_reanchor.engine.defaults`): the paper's settings off CPU; on a CPU a
candidate measured here, shipped or cached, always one that fits the drafter."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest
import torch

from factories import tiny_drafter, tiny_target
from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.engine.defaults import (
    CPU_CANDIDATES,
    PAPER_CONFIG,
    SHIPPED_FILE,
    device_config,
    fitting_candidates,
    machine_key,
    measure_candidates,
    pair_fingerprint,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("llama", vocab_size=48, seed=3)
    drafter = tiny_drafter(target, block_size=8, seed=3)
    drafter.vocab_ranking = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    return target, drafter


def small_candidates(drafter) -> tuple[ReAnchorConfig, ...]:
    return fitting_candidates(drafter, [c.replace(draft_vocab=16) for c in CPU_CANDIDATES])


def builder(pair):
    target, drafter = pair
    return lambda config: SpeculativeGenerator(target, drafter, config=config)


class _PromptTokenizer:
    """Chat template stand-in for the measurement prompts: a few in-vocabulary ids per prompt."""

    def apply_chat_template(self, messages, add_generation_prompt, return_dict):
        text = messages[0]["content"]
        return {"input_ids": [3 + (ord(ch) % 40) for ch in text[:12]]}


def test_off_cpu_the_papers_settings(pair, tmp_path):
    choice = device_config(builder(pair), torch.device("cuda"), torch.bfloat16, None, "x", None, cache_dir=tmp_path)
    assert choice.config == PAPER_CONFIG == ReAnchorConfig() and choice.source == "paper"
    assert not list(tmp_path.iterdir())


def test_candidates_fit_the_drafter(pair):
    target, drafter = pair
    plain = tiny_drafter(target, block_size=4, seed=4)  # no draft vocabulary, a 4-token block
    fitted = fitting_candidates(plain)
    assert fitted and all(c.draft_vocab is None and c.max_depth <= 3 and max(c.offsets) < 4 for c in fitted)
    for config in fitted:  # each one builds a generator over that drafter
        SpeculativeGenerator(target, plain, config=config)
    assert all(c.draft_vocab == 16 for c in small_candidates(drafter))


def test_measured_choice_is_a_candidate_and_lossless(pair):
    target, drafter = pair
    candidates = small_candidates(drafter)
    prompts = [[5, 9, 11, 3], [7, 7, 20, 4, 8]]
    choice = measure_candidates(builder(pair), prompts, candidates, max_new_tokens=12)
    assert choice.config in candidates and choice.source == "measured"
    assert choice.tokens_per_s > 0 and choice.plain_tokens_per_s > 0
    gen = SpeculativeGenerator(target, drafter, config=choice.config)
    for ids in prompts:
        assert gen.generate(ids, 16).tokens == gen.generate(ids, 16, method="target").tokens


def test_measured_once_then_cached_per_machine_and_pair(pair, tmp_path):
    _, drafter = pair
    candidates = small_candidates(drafter)
    pair_id = pair_fingerprint(*pair)
    first = device_config(builder(pair), CPU, torch.float64, None, pair_id, _PromptTokenizer(), cache_dir=tmp_path,
                          candidates=candidates, progress=None)
    files = list(tmp_path.iterdir())
    assert first.source == "measured" and len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["key"] == machine_key(CPU, torch.float64) and saved["pair"] == pair_id
    again = device_config(builder(pair), CPU, torch.float64, None, pair_id, _PromptTokenizer(), cache_dir=tmp_path,
                          candidates=candidates, progress=None)
    assert again.source == "cached" and again.config == first.config
    # another pair (or dtype) is another key: measured again, in its own file
    other = device_config(builder(pair), CPU, torch.float64, None, pair_id + "-other", _PromptTokenizer(),
                          cache_dir=tmp_path, candidates=candidates, progress=None)
    assert other.source == "measured" and len(list(tmp_path.iterdir())) == 2


def test_shipped_choice_for_the_same_cpu_kind_only(pair, tmp_path):
    _, drafter = pair
    chosen = small_candidates(drafter)[1]
    entry = {"key": machine_key(CPU, torch.float64), "config": {**asdict(chosen), "offsets": list(chosen.offsets)},
             "tokens_per_s": 30.0, "plain_tokens_per_s": 20.0}
    other = {**entry, "key": {**entry["key"], "cpu": "some other CPU"}, "config": {"offsets": [1], "node_budget": 2}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [other, entry]}))
    cache = tmp_path / "cache"
    choice = device_config(builder(pair), CPU, torch.float64, tmp_path, "p", None, cache_dir=cache, progress=None)
    assert choice.source == "shipped" and choice.config == chosen and choice.tokens_per_s == 30.0
    # measured with other weights: the choice stands, its speeds are not this drafter's
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    for sha, fresh in ((hashlib.sha256(b"other weights").hexdigest()[:12], True), ("4dd68a761ab8", False)):
        (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [other, {**entry, "drafter_sha256": sha}]}))
        again = device_config(builder(pair), CPU, torch.float64, tmp_path, "p", None, cache_dir=cache, progress=None)
        assert again.config == chosen and (again.tokens_per_s, again.plain_tokens_per_s) == \
            ((30.0, 20.0) if fresh else (None, None))
    # a float32 run on this CPU has no shipped entry; without a tokenizer nothing is measured
    fallback = device_config(builder(pair), CPU, torch.float32, tmp_path, "p", None, cache_dir=cache,
                             candidates=small_candidates(drafter), progress=None)
    assert fallback.source == "default" and fallback.config == small_candidates(drafter)[0]


def test_shipped_entries_are_valid_configs():
    from sglang_reanchor.hub import shipped_drafter_path

    folder = shipped_drafter_path()
    if folder is None or not (folder / SHIPPED_FILE).is_file():
        pytest.skip("no shipped device defaults in this build")
    for entry in json.loads((folder / SHIPPED_FILE).read_text())["entries"]:
        assert set(entry["key"]) == {"device", "cpu", "bf16_flags", "threads", "dtype"}
        config = ReAnchorConfig(**{**entry["config"], "offsets": tuple(entry["config"]["offsets"])})
        assert config.offsets and config.max_depth and entry["tokens_per_s"] > 0 and entry["plain_tokens_per_s"] > 0
        sampled = entry.get("sampled")
        if sampled:  # the choice for sampled requests: a config measured at a temperature
            ReAnchorConfig(**{**sampled["config"], "offsets": tuple(sampled["config"]["offsets"])})
            assert sampled["temperature"] > 0 and sampled["tokens_per_s"] > 0 and sampled["plain_tokens_per_s"] > 0
        profile = (entry.get("served") or {}).get("cost_profile")
        if profile:  # a shipped cost profile: of this entry's dtype and bfloat16 flags
            from sglang_reanchor.bench.cost import CostProfile

            loaded = CostProfile.load(folder / profile)
            assert loaded.dtype == entry["key"]["dtype"] and loaded.cpu_bf16_flags == entry["key"]["bf16_flags"]


def test_a_server_takes_the_entrys_served_fields_on_top(pair, tmp_path):
    """An entry's ``served`` fields (measured under load) change what an SGLang server serves on
    this CPU kind, not what the reference engine runs; any other served field is refused."""
    from sglang_reanchor.engine.defaults import shipped_choice
    from sglang_reanchor.srt.settings import served_config

    _, drafter = pair
    chosen = small_candidates(drafter)[1]
    entry = {"key": machine_key(CPU, torch.float32), "config": {**asdict(chosen), "offsets": list(chosen.offsets)},
             "served": {"config": {"batch_node_budget": 16}, "measured": "results/x/load"}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    engine = device_config(builder(pair), CPU, torch.float32, tmp_path, "p", None, cache_dir=tmp_path / "c",
                           progress=None)
    assert engine.config == chosen and engine.config.batch_node_budget is None
    served = served_config("cpu", "float32", str(tmp_path), environ={})
    assert served.source == "shipped" and served.config == chosen.replace(batch_node_budget=16)
    assert "batch_node_budget 16" in served.note and "results/x/load" in served.note
    assert served_config("cpu", "float32", str(tmp_path), tp_size=2, environ={}).config.batch_node_budget == 16
    del entry["served"]  # nothing measured under load: a batch shares one request's tree
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    served = served_config("cpu", "float32", str(tmp_path), environ={})
    assert served.config == chosen.replace(batch_node_budget=chosen.node_budget)
    assert "nothing measured under load" in served.note
    # drafting stops past a batch size: the tree's own size shared up to it
    entry["served"] = {"config": {"disable_by_batch_size": 1}, "measured": "results/y/load"}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    served = served_config("cpu", "float32", str(tmp_path), environ={})
    assert served.config == chosen.replace(batch_node_budget=chosen.node_budget, disable_by_batch_size=1)
    assert "the roots alone in batches of more than 1" in served.note and "results/y/load" in served.note
    assert device_config(builder(pair), CPU, torch.float32, tmp_path, "p", None, cache_dir=tmp_path / "c",
                         progress=None).config.disable_by_batch_size is None  # the engine runs batch 1
    entry["served"] = {"config": {"node_budget": 4}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    with pytest.raises(ValueError, match="served.config may set batch_node_budget and disable_by_batch_size only"):
        shipped_choice(tmp_path, machine_key(CPU, torch.float32))


def test_a_family_server_keeps_branching_and_drops_the_draft_vocabulary(pair, tmp_path):
    """A Domino or DSpark server (``full_vocab_only``) branches on its head's corrected scores and cuts by
    its probabilities but drafts over the whole vocabulary; a server at ``--tp-size`` > 1 runs none of the three."""
    from sglang_reanchor.srt.settings import served_config

    _, drafter = pair
    chosen = small_candidates(drafter)[-1]
    assert chosen.branch_width and chosen.draft_vocab and chosen.verify_threshold
    entry = {"key": machine_key(CPU, torch.float32), "config": {**asdict(chosen), "offsets": list(chosen.offsets)}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    family = served_config("cpu", "float32", str(tmp_path), full_vocab_only=True, environ={}).config
    assert family == chosen.replace(draft_vocab=None, batch_node_budget=chosen.node_budget)
    wide = served_config("cpu", "float32", str(tmp_path), tp_size=2, environ={}).config
    assert (wide.branch_width, wide.draft_vocab, wide.verify_threshold) == (0, None, None)
    assert served_config("cpu", "float32", str(tmp_path), environ={}).config == family.replace(
        draft_vocab=chosen.draft_vocab)


def test_a_server_budgets_batches_with_the_entrys_cost_profile(pair, tmp_path):
    """An entry's ``served.cost_profile`` (a file in the drafter folder): a server without settings
    serves the engine's choice and budgets its batches with that profile (the launcher passes its
    path on); a profile of the user's replaces it; a missing file, or one beside
    ``batch_node_budget``, is refused, naming the field."""
    from sglang_reanchor.bench.cost import CostProfile
    from sglang_reanchor.engine.defaults import shipped_choice
    from sglang_reanchor.srt.settings import COST_PROFILE_ENV, served_config

    _, drafter = pair
    chosen = small_candidates(drafter)[1]
    CostProfile(prefix=16, verify_s={1: 0.01, 64: 0.4}, draft_s={1: 1e-3}, target_token_s=0.01).save(
        tmp_path / "profile.json")
    entry = {"key": machine_key(CPU, torch.float32), "config": {**asdict(chosen), "offsets": list(chosen.offsets)},
             "served": {"cost_profile": "profile.json", "measured": "results/x/load"}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    served = served_config("cpu", "float32", str(tmp_path), environ={})
    assert served.config == chosen and served.cost_profile == str(tmp_path / "profile.json")
    assert "shipped cost profile" in served.note and "results/x/load" in served.note
    own = served_config("cpu", "float32", str(tmp_path), environ={COST_PROFILE_ENV: "/mine.json"})
    assert own.config == chosen and own.cost_profile is None and COST_PROFILE_ENV in own.note
    # the user's profile replaces a shipped batch_node_budget too (the worker refuses both)
    entry["served"] = {"config": {"batch_node_budget": 16}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    assert served_config("cpu", "float32", str(tmp_path), environ={COST_PROFILE_ENV: "/mine.json"}).config == chosen
    for served_field, match in (({"cost_profile": "absent.json"}, "served.cost_profile 'absent.json' is not a file"),
                                ({"cost_profile": "profile.json", "cost_profile_packed": "absent.json"},
                                 "served.cost_profile_packed 'absent.json' is not a file"),
                                ({"cost_profile": "profile.json", "config": {"batch_node_budget": 16}},
                                 "served.cost_profile and served.config.batch_node_budget"),
                                ({"cost_profile_packed": "profile.json", "config": {"batch_node_budget": 16}},
                                 "served.cost_profile_packed and served.config.batch_node_budget")):
        entry["served"] = served_field
        (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
        with pytest.raises(ValueError, match=match):
            shipped_choice(tmp_path, machine_key(CPU, torch.float32))


def test_a_server_that_packs_its_linears_budgets_with_the_profile_measured_packed(pair, tmp_path):
    """``served.cost_profile_packed``: a server that packs its float32 linears
    (``$SGLANG_REANCHOR_PACK_LINEARS``) budgets with it, one that does not with ``cost_profile``;
    without a packed profile both take ``cost_profile``."""
    from sglang_reanchor.bench.cost import CostProfile
    from sglang_reanchor.srt.settings import served_config

    _, drafter = pair
    chosen = small_candidates(drafter)[1]
    for name, verify in (("unpacked.json", 0.02), ("packed.json", 0.01)):
        CostProfile(prefix=16, verify_s={1: verify, 64: 0.4}, draft_s={1: 1e-3}, target_token_s=verify,
                    packed_linears=name == "packed.json").save(tmp_path / name)
    entry = {"key": machine_key(CPU, torch.float32), "config": {**asdict(chosen), "offsets": list(chosen.offsets)},
             "served": {"cost_profile": "unpacked.json", "cost_profile_packed": "packed.json"}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    packed = served_config("cpu", "float32", str(tmp_path), environ={}, packed_linears=True)
    plain = served_config("cpu", "float32", str(tmp_path), environ={}, packed_linears=False)
    assert packed.cost_profile == str(tmp_path / "packed.json") and "packed linears" in packed.note
    assert plain.cost_profile == str(tmp_path / "unpacked.json") and "packed linears" not in plain.note
    assert packed.config == plain.config == chosen
    del entry["served"]["cost_profile_packed"]
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    assert served_config("cpu", "float32", str(tmp_path), environ={},
                         packed_linears=True).cost_profile == str(tmp_path / "unpacked.json")


def test_sampled_requests_run_the_entrys_choice_for_sampling(pair, tmp_path):
    """An entry's ``sampled`` choice (measured at a temperature): `shipped_choice` reads it, and a
    generator chosen for the device decodes sampled requests with it (greedy ones with the entry's
    own config), the same tokens as plain decoding under the same seed."""
    from sglang_reanchor.engine.defaults import shipped_choice

    target, drafter = pair
    greedy_choice, sampled_choice = small_candidates(drafter)[1], small_candidates(drafter)[2]
    assert greedy_choice != sampled_choice

    def fields(c):
        return {**asdict(c), "offsets": list(c.offsets)}

    entry = {"key": machine_key(CPU, torch.float32), "config": fields(greedy_choice),
             "sampled": {"temperature": 1.0, "config": fields(sampled_choice), "tokens_per_s": 2.0,
                         "plain_tokens_per_s": 1.0}}
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    choice = shipped_choice(tmp_path, machine_key(CPU, torch.float32))
    assert choice.config == greedy_choice and choice.sampled.config == sampled_choice
    gen = SpeculativeGenerator(target, drafter, config=choice.config)
    gen.config_choice = choice  # as from_pretrained() sets it
    prompt = [5, 9, 11, 3, 17]
    assert gen.generate(prompt, 12).tokens == gen.generate(prompt, 12, method="target").tokens
    assert gen._sampled is None  # greedy requests: the entry's own config
    for seed in range(3):
        got = gen.generate(prompt, 12, temperature=1.0, seed=seed)
        assert got.tokens == gen.generate(prompt, 12, method="target", temperature=1.0, seed=seed).tokens
    assert gen._sampled is not None and gen._sampled.config == sampled_choice
    del entry["sampled"]
    (tmp_path / SHIPPED_FILE).write_text(json.dumps({"entries": [entry]}))
    assert shipped_choice(tmp_path, machine_key(CPU, torch.float32)).sampled is None

"""REANCHOR inside SGLang on CPU (attention: the plugin's ``reanchor_sdpa``, and Triton under TRITON_INTERPRET=1), against oracles.

A tiny random Llama target and DFlash drafter (float32) are saved as Hugging Face
folders. The same pair runs

- through SGLang with ``--speculative-algorithm REANCHOR`` (batched requests that
  finish at different steps, a repeated prompt served from the radix cache, a
  sampled request), and
- through the project's reference engine (`SpeculativeGenerator`), the oracle:
  per request, the SGLang tokens must equal the reference tokens, and the
  per-round acceptance lengths from the worker's trace must equal the reference's;
- through SGLang without speculation: tokens must be identical at T=0.

The pair (seeds 4/2, offset policy) was picked because its rounds accept through
shifted rows (accepted tree paths leave the baseline chain, so KV moves happen).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import budget_trace  # noqa: E402
from factories import tiny_drafter, tiny_target, write_zlab_drafter  # noqa: E402

from sglang_reanchor import SpeculativeGenerator  # noqa: E402
from sglang_reanchor.drafter.draft_vocab import save_draft_vocab  # noqa: E402
from sglang_reanchor.srt.settings import parse_config  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPTS = {
    "a": ([1, 5, 9, 14, 3, 7, 22, 9], 24),
    "b": ([1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], 10),
    "c": ([1, 30, 31, 17], 31),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tinypair")
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                         dtype=torch.float32, seed=4)
    target.config.torch_dtype = torch.float32
    target.save_pretrained(root / "target")
    drafter = tiny_drafter(target, block_size=8, target_layer_ids=[0, 2], seed=2)
    write_zlab_drafter(drafter, root / "drafter")
    # a draft vocabulary: half the tokens, in a shuffled order ("draft_vocab": 32 drafts from them only)
    drafter.vocab_ranking = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    save_draft_vocab(root / "drafter", drafter.vocab_ranking)
    return root, target, drafter


def serve(root: Path, algorithm: str, rounds: list, config: str | None, trace: Path | None,
          extra_env: dict[str, str] | None = None, engine_args: dict | None = None, want_log: bool = False) -> dict:
    """The results of `serve_tiny.py` (its stderr under ``"_log"`` with ``want_log``)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", **(extra_env or {})}
    env.pop("SGLANG_REANCHOR_CONFIG", None)
    if config:
        env["SGLANG_REANCHOR_CONFIG"] = config
    if trace:
        env["SGLANG_REANCHOR_TRACE"] = str(trace)
    out = subprocess.run([sys.executable, str(HERE / "serve_tiny.py"), str(root), algorithm, json.dumps(rounds),
                          json.dumps(engine_args or {})],
                         capture_output=True, text=True, env=env, timeout=1200)
    for line in out.stdout.splitlines():
        if line.startswith("RESULTS"):
            return {**json.loads(line[len("RESULTS"):]), **({"_log": out.stderr} if want_log else {})}
    raise AssertionError(f"engine failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")


def family_drafter(family: str, target, drafter, markov_head_type: str):
    """The pair's DFlash ``drafter``, or for ``"domino"`` / ``"dspark"`` a tiny drafter of that family over
    ``target`` with the same 8-slot query window (a DSpark head of ``markov_head_type``, DFlash's layout)."""
    from factories import tiny_domino_drafter, tiny_dspark_drafter

    if family == "domino":
        return tiny_domino_drafter(target, block_size=8, target_layer_ids=[0, 2], seed=5)
    if family == "dspark":
        return tiny_dspark_drafter(target, block_size=7, target_layer_ids=[0, 2], seed=6,
                                   markov_head_type=markov_head_type, markov_rank=5, sample_from_anchor=False)
    return drafter


def pair_with_drafter(root: Path, folder: Path, drafter) -> Path:
    """``folder`` holding the pair's target (a link) and ``drafter`` (saved): a pair for `serve`."""
    folder.mkdir()
    (folder / "target").symlink_to(root / "target")
    write_zlab_drafter(drafter, folder / "drafter")
    return folder


def trace_taus(trace: Path, field: str = "tau") -> dict[str, list[int]]:
    """Each request's rounds' ``field`` (``tau``, ``nodes``, ...) from a server's trace."""
    taus: dict[str, list[int]] = defaultdict(list)
    for line in trace.read_text().splitlines():
        row = json.loads(line)
        taus[row["rid"]].append(row[field])
    return taus


ROUNDS = [
    [{"rid": k, "input_ids": p, "max_new_tokens": n} for k, (p, n) in PROMPTS.items()],  # one batch
    [{"rid": "a-again", "input_ids": PROMPTS["a"][0], "max_new_tokens": PROMPTS["a"][1]}],  # radix hit
    [{"rid": "sampled", "input_ids": PROMPTS["c"][0], "max_new_tokens": 12, "temperature": 0.8}],
    # a next turn: the first request's prompt and answer (cached, draft KV included) plus new tokens
    [{"rid": "a-next", "continues": "a", "append": [1, 17, 23], "max_new_tokens": 16}],
]


@pytest.mark.parametrize(
    "config,method,backend",
    [('{"policy": "offset"}', "reanchor", "reanchor_sdpa"), ('{"policy": "offset"}', "reanchor", "triton"),
     (None, "reanchor", "reanchor_sdpa"), ('{"offsets": []}', "dflash", "reanchor_sdpa"),
     ('{"offsets": []}', "dflash", "triton"),
     ('{"policy": "offset", "offsets": [1, 2], "max_depth": 3}', "reanchor", "reanchor_sdpa"),
     ('{"offsets": [], "max_depth": 2}', "dflash", "reanchor_sdpa"),
     ('{"policy": "offset", "draft_vocab": 32}', "reanchor", "reanchor_sdpa"),
     ('{"policy": "offset", "branch_width": 2, "branch_rows": 4, "draft_vocab": 48}', "reanchor", "reanchor_sdpa"),
     ('{"offsets": [], "branch_width": 1, "branch_rows": 3, "branch_length": 3}', "reanchor", "reanchor_sdpa"),
     ('{"policy": "offset", "offsets": [1], "branch_width": 2, "branch_rows": 6, "branch_length": 4, '
      '"branch_shape": "best_first", "node_budget": 16}', "reanchor", "reanchor_sdpa"),
     ('{"policy": "offset", "offsets": [1, 2], "draft_slots": 4}', "reanchor", "reanchor_sdpa")],
    ids=["offset", "offset-triton", "default", "no-offsets-is-dflash", "no-offsets-is-dflash-triton",
         "offset-max-depth", "dflash-max-depth", "draft-vocab", "branching", "branching-chain", "best-first",
         "draft-slots"],
)
def test_reanchor_in_sglang_matches_the_reference_engine(pair, tmp_path, config, method, backend):
    """With no offsets the plugin drafts and verifies DFlash's chain: the oracle is the reference DFlash.

    Both CPU attention backends that apply the tree mask: the plugin's ``reanchor_sdpa``
    (the default) and SGLang's Triton kernels in the interpreter.
    """
    root, target, drafter = pair
    trace = tmp_path / "trace.jsonl"
    got = serve(root, "REANCHOR", ROUNDS, config, trace, engine_args={"attention_backend": backend})
    reference = SpeculativeGenerator(target, drafter, config=parse_config(config or "{}"))
    taus = trace_taus(trace)
    cases = list(PROMPTS.items()) + [("a-again", PROMPTS["a"]), ("a-next", (got["a-next"]["input_ids"], 16))]
    for rid, (prompt, n) in cases:
        ref = reference.generate(prompt, n, method=method)
        assert got[rid]["output_ids"] == ref.tokens, rid
        assert taus[rid] == ref.acceptance_lengths, rid
        assert got[rid]["spec_verify_ct"] == len(ref.acceptance_lengths), rid
    assert got["a-next"]["input_ids"][: len(PROMPTS["a"][0])] == PROMPTS["a"][0]
    assert got["a-again"]["cached_tokens"] > 0  # the radix cache served the committed prefix
    assert got["a-next"]["cached_tokens"] > len(PROMPTS["a"][0])  # ... including generated tokens
    assert len(got["sampled"]["output_ids"]) == 12
    if config and method == "reanchor" and '"offsets": []' not in config:  # this pair accepts through shifted rows
        assert max(max(t) for t in taus.values()) > 1


def test_batch_node_budget_shrinks_trees_as_the_batch_grows(pair, tmp_path):
    """``batch_node_budget`` caps each request at its share of the batch's verify nodes, and
    ``disable_by_batch_size`` (2) stops drafting past a batch size: 3 requests together verify
    their roots alone (a plain decode step, where their share 7 // 3 = 2 would verify a draft),
    2 requests 3 nodes each, a request alone up to 7; the tokens stay the reference engine's
    greedy ones. Request b decodes all its tokens in the batch of 3, whose draft-KV rows wait
    in the worker's backlog (`draft_kv_backlog`) until b has finished; its next turn, alone,
    drafts over them (the radix cache's copy) the reference engine's rounds."""
    root, target, drafter = pair
    trace = tmp_path / "trace.jsonl"
    config = '{"policy": "offset", "batch_node_budget": 7, "disable_by_batch_size": 2}'
    b_next = [{"rid": "b-next", "continues": "b", "append": [1, 17, 23], "max_new_tokens": 16}]
    got = serve(root, "REANCHOR", [*ROUNDS[:2], b_next], config, trace)
    reference = SpeculativeGenerator(target, drafter, config=parse_config(config))
    for rid, (prompt, n) in [*PROMPTS.items(), ("a-again", PROMPTS["a"])]:
        assert got[rid]["output_ids"] == reference.generate(prompt, n, method="reanchor").tokens, rid
    ref_next = reference.generate(got["b-next"]["input_ids"], 16, method="reanchor")
    assert got["b-next"]["output_ids"] == ref_next.tokens
    assert trace_taus(trace)["b-next"] == ref_next.acceptance_lengths
    assert got["b-next"]["cached_tokens"] > len(PROMPTS["b"][0])  # b's generated tokens' rows were read
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert all(r["nodes"] <= max(1, 7 // r["batch"]) for r in rows), rows
    assert {r["batch"] for r in rows} >= {1, 3}  # both regimes ran
    assert all(r["nodes"] == 1 and r["tau"] == 1 for r in rows if r["batch"] == 3)  # plain decoding steps
    assert max(r["nodes"] for r in rows if r["batch"] == 1) > 2  # alone, a request keeps a tree


def test_cost_profile_budget_shrinks_trees_as_the_batch_grows(pair, tmp_path):
    """``$SGLANG_REANCHOR_COST_PROFILE``: the batch-aware budget (`BatchBudget`) from a cost
    profile whose verify curve is flat to 8 tokens and steep past it. A request alone keeps its
    tree (8 nodes cost 10 % more than one); three together verify at most 2 nodes each (3 x 4
    = 12 tokens cost 7x one), except in exploration rounds (the first, then every 8th); tokens
    stay the reference engine's greedy ones whatever the budget."""
    from sglang_reanchor.bench.cost import CostProfile

    root, target, drafter = pair
    profile = tmp_path / "cost_profile.json"
    CostProfile(prefix=16, verify_s={1: 0.01, 8: 0.011, 9: 0.05, 64: 0.4}, draft_s={1: 1e-4, 64: 64e-4},
                target_token_s=0.01, dtype="float32").save(profile)
    trace = tmp_path / "trace.jsonl"
    config = '{"policy": "offset", "node_budget": 8}'
    got = serve(root, "REANCHOR", ROUNDS[:2], config, trace, extra_env={"SGLANG_REANCHOR_COST_PROFILE": str(profile)})
    reference = SpeculativeGenerator(target, drafter, config=parse_config(config))
    for rid, (prompt, n) in [*PROMPTS.items(), ("a-again", PROMPTS["a"])]:
        assert got[rid]["output_ids"] == reference.generate(prompt, n, method="reanchor").tokens, rid
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    together = [r for r in rows if r["batch"] == 3]
    assert together and sum(r["nodes"] <= 2 for r in together) >= 0.7 * len(together)
    assert max(r["nodes"] for r in rows if r["batch"] == 1) > 2  # alone, a request keeps a tree
    # the trace times each round and holds what the budget expected of every budget it knew
    assert all(r["nodes"] <= r["budget"] and r["round_s"] > 0 and "1" in r["expected"] for r in rows)
    chosen = [r for r in rows if r["expected"] and len(r["expected"]) > 1]
    assert chosen and all(r["expected"][str(r["budget"])] > 0 for r in chosen if str(r["budget"]) in r["expected"])
    rounds = budget_trace.read_rounds(trace)
    assert len(rounds) < len(rows) and sum(r["tokens"] for r in rounds) == sum(r["tau"] for r in rows)
    table = budget_trace.summarise(rounds)
    assert {(t["batch"], t["budget"]) for t in table} == {(r["batch"], r["budget"]) for r in rows}
    assert sum(t["rounds"] for t in table) == len(rounds) and all(t["delivered_tok_s"] > 0 for t in table)


TP2_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}  # SGLang binds TP rank r to core r


@pytest.fixture(scope="module")
def plain_tp2(pair):
    """A plain ``--tp-size 2`` server's answers (once for every family below)."""
    root, _, _ = pair
    return serve(root, "NONE", ROUNDS[:1], None, None, extra_env=TP2_ENV, engine_args={"tp_size": 2})


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two TP ranks bound to one core each")
@pytest.mark.parametrize("family", ["dflash", "domino", "dspark", "roots-alone"])
def test_two_tp_ranks_serve_plain_sglangs_tokens(pair, plain_tp2, tmp_path, family):
    """``--tp-size 2`` on CPU (gloo; SGLang binds rank r to core r): REANCHOR with the offset
    policy, whose rounds accept through shifted rows, equals a plain TP-2 server token for token,
    with a DFlash drafter (the drafts use the TP-safe argmax over the vocab-parallel head:
    `cpu_compat` ALL_GATHER) and with Domino and DSpark drafters (SGLang's own rollouts, which
    gather the vocab-parallel logits themselves), and every rank drafts the same tree (the
    trace of rank 0 equals the reference engine's rounds); and with every round the root alone
    (the worker's decode step, `_decode_roots`, over the vocab-parallel LM head)."""
    root, target, drafter = pair
    drafter = family_drafter(family, target, drafter, markov_head_type="gated")
    spec_root = root if family in ("dflash", "roots-alone") else pair_with_drafter(root, tmp_path / family, drafter)
    trace = tmp_path / "trace.jsonl"
    config = '{"policy": "offset", "batch_node_budget": 1}' if family == "roots-alone" else '{"policy": "offset"}'
    spec = serve(spec_root, "REANCHOR", ROUNDS[:1], config, trace, extra_env=TP2_ENV, engine_args={"tp_size": 2})
    for rid in PROMPTS:
        assert spec[rid]["output_ids"] == plain_tp2[rid]["output_ids"], rid
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    if family == "roots-alone":
        assert rows and all(r["nodes"] == 1 for r in rows)
        return
    assert sum(r["shifted_accepts"] for r in rows) > 0 or family != "dflash"
    if family != "dflash":  # the family head's rounds, as the engine drafts them
        reference = SpeculativeGenerator(target, drafter, config=parse_config(config))
        taus = trace_taus(trace)
        for rid, (prompt, n) in PROMPTS.items():
            assert taus[rid] == reference.generate(prompt, n, method="reanchor").acceptance_lengths, rid


def test_reanchor_tokens_equal_plain_sglang(pair):
    root, _, _ = pair
    rounds = ROUNDS[:1]
    plain = serve(root, "NONE", rounds, None, None)
    spec = serve(root, "REANCHOR", rounds, '{"policy": "offset"}', None)
    for rid in PROMPTS:
        assert spec[rid]["output_ids"] == plain[rid]["output_ids"], rid


BRANCHING = '{"policy": "offset", "branch_width": 4, "branch_rows": 8, "branch_length": 2}'
BEST_FIRST = ('{"policy": "offset", "branch_width": 3, "branch_rows": 8, "branch_length": 3, '
              '"branch_shape": "best_first", "node_budget": 24}')


@pytest.mark.parametrize("config", ['{"policy": "offset"}', BRANCHING, BEST_FIRST],
                         ids=["trees", "branching", "best-first"])
def test_a_domino_drafter_serves_the_reference_engines_rounds(pair, tmp_path, config):
    """A Domino drafter (SGLang's ``projector_type: "domino"`` format): every block, the baseline
    and the shifted ones, is rolled out from its own anchor by SGLang's `domino_greedy_rollout` in
    the worker, by `DominoHead` in the reference engine (equal to SGLang's,
    tests_sglang/test_drafter_families.py); with branching the worker rolls out with `DominoHead`
    too (over SGLang's loaded modules), for the scores its branches are chosen from. Tokens and
    rounds equal the engine's, and the tokens equal plain greedy decoding. (SGLang's own Domino
    runtime wants CUDA and bfloat16: the CPU hook ``domino-on-cpu`` in `seam` keeps its other checks.)"""
    from factories import tiny_domino_drafter

    root, target, _ = pair
    domino = tiny_domino_drafter(target, block_size=8, target_layer_ids=[0, 2], seed=5)
    domino_root = pair_with_drafter(root, tmp_path / "domino", domino)
    trace = tmp_path / "trace.jsonl"
    got = serve(domino_root, "REANCHOR", ROUNDS[:1], config, trace)
    reference = SpeculativeGenerator(target, domino, config=parse_config(config))
    taus, nodes = trace_taus(trace), trace_taus(trace, "nodes")
    unbranched = SpeculativeGenerator(target, domino, config=parse_config(config).replace(branch_width=0))
    for rid, (prompt, n) in PROMPTS.items():
        ref = reference.generate(prompt, n, method="reanchor")
        assert got[rid]["output_ids"] == ref.tokens == reference.generate(prompt, n, method="target").tokens, rid
        assert taus[rid] == ref.acceptance_lengths and nodes[rid] == ref.tree_sizes, rid
        if "branch_width" in config:  # the branches are in the trees: wider than without them
            assert sum(ref.tree_sizes) > sum(unbranched.generate(prompt, n, method="reanchor").tree_sizes), rid
    assert max(max(t) for t in taus.values()) > 1  # drafts are accepted (random weights: via shifted rows)


@pytest.mark.parametrize("kind,sample_from_anchor,gamma,config",
                         [("rnn", True, 8, '{"policy": "offset"}'), ("gated", False, 7, '{"policy": "offset"}'),
                          ("vanilla", False, 7, BRANCHING)],
                         ids=["rnn-from-anchor", "gated-dflash-layout", "vanilla-branching"])
def test_a_dspark_drafter_serves_the_reference_engines_rounds(pair, tmp_path, kind, sample_from_anchor, gamma, config):
    """A DSpark drafter (SGLang's ``Qwen3DSparkModel`` format) served by REANCHOR: SGLang loads it with
    its own DSpark model class, every block is rolled out by SGLang's ``draft_markov_block`` on
    ``compute_base_logits`` in the worker and by `DSparkHead` in the reference engine (equal to SGLang's,
    tests_sglang/test_drafter_families.py); with branching the worker rolls out with `DSparkHead` over
    SGLang's loaded Markov head. Both query layouts: ``gamma`` slots from the anchor, and
    ``gamma + 1`` (DFlash's). Tokens and rounds equal the engine's, tokens equal plain greedy decoding."""
    from factories import tiny_dspark_drafter

    root, target, _ = pair
    dspark = tiny_dspark_drafter(target, block_size=gamma, target_layer_ids=[0, 2], seed=6, markov_head_type=kind,
                                 markov_rank=5, sample_from_anchor=sample_from_anchor)
    assert dspark.block_size == 8  # query slots: the same window as the DFlash drafter's
    ds_root = pair_with_drafter(root, tmp_path / "dspark", dspark)
    trace = tmp_path / "trace.jsonl"
    got = serve(ds_root, "REANCHOR", ROUNDS[:1], config, trace)
    reference = SpeculativeGenerator(target, dspark, config=parse_config(config))
    taus, nodes = trace_taus(trace), trace_taus(trace, "nodes")
    unbranched = SpeculativeGenerator(target, dspark, config=parse_config(config).replace(branch_width=0))
    for rid, (prompt, n) in PROMPTS.items():
        ref = reference.generate(prompt, n, method="reanchor")
        assert got[rid]["output_ids"] == ref.tokens == reference.generate(prompt, n, method="target").tokens, rid
        assert taus[rid] == ref.acceptance_lengths and nodes[rid] == ref.tree_sizes, rid
        if config == BRANCHING:  # the branches are in the trees: wider than without them
            assert sum(ref.tree_sizes) > sum(unbranched.generate(prompt, n, method="reanchor").tree_sizes), rid
    assert max(max(t) for t in taus.values()) > 1  # drafts are accepted


CUT = '{"policy": "offset", "offsets": [1, 2], "verify_threshold": 0.05}'


@pytest.mark.parametrize("family,config", [("dflash", CUT), ("dflash", CUT[:-1] + ', "draft_vocab": 32}'),
                                           ("domino", CUT[:-1] + ', "branch_width": 2, "branch_rows": 4}'),
                                           ("dflash", CUT[:-1] + ', "branch_width": 2, "branch_rows": 6, '
                                                      '"branch_shape": "best_first"}'),
                                           ("dspark", CUT)],
                         ids=["dflash", "dflash-draft-vocab", "domino-branching", "dflash-best-first", "dspark"])
def test_a_confidence_cut_serves_the_reference_engines_trees(pair, tmp_path, family, config):
    """``verify_threshold`` served: each drafted row (and branch) cut where the running product of the
    drafter's probabilities falls below it, from the probabilities the worker scores as the engine does
    (DFlash's LM head, over the draft vocabulary too; a Domino / DSpark head's corrected scores). On a
    CPU the worker trims each tree to its real nodes, so the cut is verify work saved. Tokens, taus and
    verified nodes per round equal the engine's; the trees are narrower than uncut ones."""
    root, target, drafter = pair
    drafter = family_drafter(family, target, drafter, markov_head_type="rnn")
    served_root = root if family == "dflash" else pair_with_drafter(root, tmp_path / family, drafter)
    trace = tmp_path / "trace.jsonl"
    got = serve(served_root, "REANCHOR", ROUNDS[:1], config, trace)
    reference = SpeculativeGenerator(target, drafter, config=parse_config(config))
    uncut = SpeculativeGenerator(target, drafter, config=parse_config(config).replace(verify_threshold=None))
    taus, nodes = trace_taus(trace), trace_taus(trace, "nodes")
    for rid, (prompt, n) in PROMPTS.items():
        ref = reference.generate(prompt, n, method="reanchor")
        assert got[rid]["output_ids"] == ref.tokens == reference.generate(prompt, n, method="target").tokens, rid
        assert taus[rid] == ref.acceptance_lengths and nodes[rid] == ref.tree_sizes, rid
        assert sum(ref.tree_sizes) < sum(uncut.generate(prompt, n, method="reanchor").tree_sizes), rid


@pytest.mark.parametrize("config,refusal", [('{"draft_vocab": 8}', "draft_vocab is not served"),
                                            ('{"draft_slots": 4}', "draft_slots is not served")],
                         ids=["draft-vocab", "draft-slots"])
def test_a_dspark_server_refuses_what_its_rollout_cannot_serve(pair, tmp_path, config, refusal):
    """A draft vocabulary or shortened blocks with a DSpark drafter: the scheduler refuses them at
    start-up, naming the fields."""
    from factories import tiny_dspark_drafter

    root, target, _ = pair
    ds_root = pair_with_drafter(root, tmp_path / "dspark", tiny_dspark_drafter(target, block_size=8,
                                                                              target_layer_ids=[0, 2]))
    with pytest.raises(AssertionError, match=refusal):
        serve(ds_root, "REANCHOR", ROUNDS[:1], config, None)


def test_a_cpu_server_without_settings_serves_the_drafter_folders_choice(pair, tmp_path):
    """No ``$SGLANG_REANCHOR_CONFIG``; the drafter folder ships a choice for this CPU kind and
    float32 (`settings.served_config`), with nothing measured under load: the launcher resolves
    it and the scheduler it spawns serves it, a batch sharing one request's tree
    (``batch_node_budget`` = its ``node_budget``), with the reference engine's tokens, and its
    rounds for the request left alone."""
    import shutil

    from sglang_reanchor.engine.defaults import machine_key

    root, target, drafter = pair
    here = tmp_path / "pair"
    here.mkdir()
    (here / "target").symlink_to(root / "target")
    shutil.copytree(root / "drafter", here / "drafter")
    shipped = {"policy": "offset", "offsets": [1], "node_budget": 6, "max_depth": 3, "draft_vocab": 32}
    entry = {"key": machine_key(torch.device("cpu"), torch.float32), "config": shipped}
    (here / "drafter" / "device_defaults.json").write_text(json.dumps({"entries": [entry]}))
    trace = tmp_path / "trace.jsonl"
    got = serve(here, "REANCHOR", ROUNDS[:1], None, trace)
    reference = SpeculativeGenerator(target, drafter, config=parse_config(json.dumps(shipped)))
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    for rid, (prompt, n) in PROMPTS.items():
        ref = reference.generate(prompt, n, method="reanchor")
        assert got[rid]["output_ids"] == ref.tokens, rid
    assert all(r["nodes"] <= max(1, 6 // r["batch"]) for r in rows)  # the shipped budget, shared by the batch
    alone = [r for r in rows if r["batch"] == 1]  # the longest request, once the others finished
    assert alone and max(r["nodes"] for r in alone) > 2


# a verify of up to 8 nodes costs one node's, drafting next to nothing: trees pay for a request
# alone, roots alone (or 2 nodes) for three together
SMALL_BATCH_PROFILE = {"verify_s": {1: 0.01, 8: 0.011, 9: 0.05, 64: 0.4}, "draft_s": {1: 1e-4, 64: 64e-4}}


def _pair_shipping(pair, tmp_path: Path, config: dict, profiles: dict[str, dict], **served: str) -> Path:
    """A copy of ``pair`` whose drafter folder ships ``config`` for this CPU kind in float32, the cost
    ``profiles`` (file name -> `CostProfile` fields: verify_s, draft_s, ...), ``served`` naming them
    (default: the first as ``cost_profile``)."""
    import shutil

    from sglang_reanchor.bench.cost import CostProfile
    from sglang_reanchor.engine.defaults import machine_key

    root = pair[0]
    here = tmp_path / "pair"
    here.mkdir()
    (here / "target").symlink_to(root / "target")
    shutil.copytree(root / "drafter", here / "drafter")
    for name, costs in profiles.items():
        CostProfile(prefix=16, target_token_s=0.01, dtype="float32", **costs).save(here / "drafter" / name)
    entry = {"key": machine_key(torch.device("cpu"), torch.float32), "config": config,
             "served": served or {"cost_profile": next(iter(profiles))}}
    (here / "drafter" / "device_defaults.json").write_text(json.dumps({"entries": [entry]}))
    return here


def test_a_cpu_server_without_settings_budgets_batches_with_the_shipped_cost_profile(pair, tmp_path):
    """No settings; the drafter folder's entry for this CPU kind ships a cost profile
    (``served.cost_profile``): the launcher passes it on and the scheduler budgets each round
    by it (`BatchBudget`; the profile of `test_cost_profile_budget_shrinks_trees_as_the_batch_grows`):
    a request alone keeps its tree, three together mostly verify their roots alone or 2 nodes;
    tokens stay the reference engine's."""
    _, target, drafter = pair
    shipped = {"policy": "offset", "node_budget": 8}
    here = _pair_shipping(pair, tmp_path, shipped, {"profile.json": SMALL_BATCH_PROFILE})
    trace = tmp_path / "trace.jsonl"
    got = serve(here, "REANCHOR", ROUNDS[:2], None, trace)
    reference = SpeculativeGenerator(target, drafter, config=parse_config(json.dumps(shipped)))
    for rid, (prompt, n) in [*PROMPTS.items(), ("a-again", PROMPTS["a"])]:
        assert got[rid]["output_ids"] == reference.generate(prompt, n, method="reanchor").tokens, rid
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    together = [r for r in rows if r["batch"] == 3]
    assert together and sum(r["nodes"] <= 2 for r in together) >= 0.7 * len(together)
    assert max(r["nodes"] for r in rows if r["batch"] == 1) > 2  # alone, a request keeps a tree


def test_a_server_that_packs_its_linears_budgets_with_the_shipped_packed_profile(pair, tmp_path):
    """No settings, ``$SGLANG_REANCHOR_PACK_LINEARS=1``; the entry ships a profile measured with
    unpacked linears by which drafting never pays and one measured packed by which it does
    (``served.cost_profile_packed``): the launcher passes the packed one on (the worker warns on a
    profile whose packing differs from the server's, and names it); tokens stay the reference
    engine's. (Which budgets the server then picks follows its own measured round times, not the
    profile's, once it has timed a round of each: not asserted here.)"""
    from sglang_reanchor.srt.packed_linears import PACK_LINEARS_ENV

    _, target, drafter = pair
    shipped = {"policy": "offset", "node_budget": 8}
    never = {"verify_s": {1: 0.01, 64: 0.4}, "draft_s": {1: 10.0, 64: 640.0}}
    packed = {**SMALL_BATCH_PROFILE, "packed_linears": True}
    here = _pair_shipping(pair, tmp_path, shipped, {"unpacked.json": never, "packed.json": packed},
                          cost_profile="unpacked.json", cost_profile_packed="packed.json")
    trace = tmp_path / "trace.jsonl"
    got = serve(here, "REANCHOR", ROUNDS[:2], None, trace, extra_env={PACK_LINEARS_ENV: "1"}, want_log=True)
    log = got.pop("_log")
    assert "float32 CPU linears run on oneDNN weights packed once" in log  # the server packs
    assert "measured with unpacked linears" not in log and "unpacked.json" not in log, log[-3000:]
    reference = SpeculativeGenerator(target, drafter, config=parse_config(json.dumps(shipped)))
    for rid, (prompt, n) in [*PROMPTS.items(), ("a-again", PROMPTS["a"])]:
        assert got[rid]["output_ids"] == reference.generate(prompt, n, method="reanchor").tokens, rid
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert max(r["nodes"] for r in rows if r["batch"] == 1) > 2  # alone, a request drafts trees

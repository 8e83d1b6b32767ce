"""REANCHOR inside SGLang on CPU (Triton kernels under TRITON_INTERPRET=1), against oracles.

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
from factories import tiny_drafter, tiny_target, write_zlab_drafter  # noqa: E402

from sglang_reanchor import SpeculativeGenerator  # noqa: E402
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
    return root, target, drafter


def serve(root: Path, algorithm: str, rounds: list, config: str | None, trace: Path | None,
          extra_env: dict[str, str] | None = None, engine_args: dict | None = None) -> dict:
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
            return json.loads(line[len("RESULTS"):])
    raise AssertionError(f"engine failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")


def trace_taus(trace: Path) -> dict[str, list[int]]:
    taus: dict[str, list[int]] = defaultdict(list)
    for line in trace.read_text().splitlines():
        row = json.loads(line)
        taus[row["rid"]].append(row["tau"])
    return taus


ROUNDS = [
    [{"rid": k, "input_ids": p, "max_new_tokens": n} for k, (p, n) in PROMPTS.items()],  # one batch
    [{"rid": "a-again", "input_ids": PROMPTS["a"][0], "max_new_tokens": PROMPTS["a"][1]}],  # radix hit
    [{"rid": "sampled", "input_ids": PROMPTS["c"][0], "max_new_tokens": 12, "temperature": 0.8}],
    # a next turn: the first request's prompt and answer (cached, draft KV included) plus new tokens
    [{"rid": "a-next", "continues": "a", "append": [1, 17, 23], "max_new_tokens": 16}],
]


@pytest.mark.parametrize(
    "config,method",
    [('{"policy": "offset"}', "reanchor"), (None, "reanchor"), ('{"offsets": []}', "dflash")],
    ids=["offset", "default", "no-offsets-is-dflash"],
)
def test_reanchor_in_sglang_matches_the_reference_engine(pair, tmp_path, config, method):
    """With no offsets the plugin drafts and verifies DFlash's chain: the oracle is the reference DFlash."""
    root, target, drafter = pair
    trace = tmp_path / "trace.jsonl"
    got = serve(root, "REANCHOR", ROUNDS, config, trace)
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
    if config and method == "reanchor":  # this pair accepts through shifted rows under the offset policy
        assert max(max(t) for t in taus.values()) > 1


def test_reanchor_tokens_equal_plain_sglang(pair):
    root, _, _ = pair
    rounds = ROUNDS[:1]
    plain = serve(root, "NONE", rounds, None, None)
    spec = serve(root, "REANCHOR", rounds, '{"policy": "offset"}', None)
    for rid in PROMPTS:
        assert spec[rid]["output_ids"] == plain[rid]["output_ids"], rid


def test_grammar_and_logprob_requests_are_refused_and_the_server_goes_on(pair):
    root, target, drafter = pair
    prompt, n = PROMPTS["a"]
    rounds = [
        [{"rid": "logprob", "input_ids": prompt, "max_new_tokens": n, "return_logprob": True}],
        [{"rid": "regex", "input_ids": PROMPTS["b"][0], "max_new_tokens": 4, "regex": "[ab]+"}],
        [{"rid": "ok", "input_ids": prompt, "max_new_tokens": n},  # served as usual afterwards
         {"rid": "after", "input_ids": PROMPTS["c"][0], "max_new_tokens": 8}],
    ]
    got = serve(root, "REANCHOR", rounds, None, None)
    for rid, field in (("logprob", "return_logprob"), ("regex", "sampling_params.regex")):
        message = got[rid].get("error", "")
        assert "REANCHOR does not support" in message and field in message, (rid, got[rid])
    gen = SpeculativeGenerator(target, drafter, config=parse_config("{}"))
    for rid, (ids, m) in (("ok", (prompt, n)), ("after", (PROMPTS["c"][0], 8))):
        assert got[rid]["output_ids"] == gen.generate(ids, m, method="reanchor").tokens, rid


PROBE = """
import json, os


def register():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    targets = {"extend_kwargs": (ModelRunner, "_extend_forward_kwargs"),
               "triton_extend": (TritonAttnBackend, "forward_extend")}
    originals = {k: cls.__dict__[name] for k, (cls, name) in targets.items()}

    def after_scheduler_init(result, *args, **kwargs):
        untouched = {k: cls.__dict__[name] is originals[k] for k, (cls, name) in targets.items()}
        with open(os.environ["PROBE_OUT"], "a") as f:
            f.write(json.dumps(untouched) + "\\n")
        return result

    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__", after_scheduler_init, HookType.AFTER)
"""


def test_plain_server_keeps_sglang_functions_untouched(pair, tmp_path):
    """In a scheduler process, once its workers exist, the plugin's serving hooks are in only under REANCHOR.

    A second plugin (a dist-info on PYTHONPATH, loaded by SGLang's ``load_plugins``
    like this package) records SGLang's original functions at plugin-load time and,
    after ``Scheduler.__init__``, whether they are still the originals.
    """
    root, _, _ = pair
    site = tmp_path / "probe_site"
    (site / "reanchor_probe-0.0.dist-info").mkdir(parents=True)
    (site / "reanchor_probe-0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: reanchor-probe\nVersion: 0.0\n")
    (site / "reanchor_probe-0.0.dist-info" / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nprobe = reanchor_probe:register\n")
    (site / "reanchor_probe.py").write_text(PROBE)
    pythonpath = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    seen = {}
    for algorithm in ("NONE", "REANCHOR"):
        out = tmp_path / f"probe-{algorithm}.jsonl"
        rounds = [[{"rid": "x", "input_ids": PROMPTS["b"][0], "max_new_tokens": 2}]]
        got = serve(root, algorithm, rounds, None, None, {"PYTHONPATH": pythonpath, "PROBE_OUT": str(out)})
        assert len(got["x"]["output_ids"]) == 2
        seen[algorithm] = [json.loads(line) for line in out.read_text().splitlines()]
    assert seen["NONE"] == [{"extend_kwargs": True, "triton_extend": True}]  # plain: SGLang's own code path
    assert seen["REANCHOR"] == [{"extend_kwargs": False, "triton_extend": False}]  # the probe sees hooks


CONTEXT = 48  # --context-length of the context-end test
NEAR_END_CONFIG = '{"node_budget": 16}'  # draft window X + Q = 3 + 4 * 8 = 35 columns, wider than the tree
WINDOW = 35


def test_requests_ending_at_the_context_end(pair, tmp_path):
    """Requests whose prompt + max_new_tokens ends 0 .. WINDOW + 2 tokens before the context length.

    Plain SGLang refuses ``prompt + max_new_tokens > context_length`` (tokenizer
    manager) and prompts of ``context_length - 6`` tokens or more (the scheduler's
    ``max_req_input_len``), and serves at most ``context_length - 2 - prompt`` new
    tokens (the scheduler's cap, ``max_req_len - input_len - 1``). REANCHOR must do the same:
    every distance, in one batch (the requests end in neighbouring req_to_token
    rows), then a refused request and one more afterwards.
    """
    root, _, _ = pair
    gen = torch.Generator().manual_seed(7)
    batch = []
    for k in range(WINDOW + 3):  # every distance; prompts of CONTEXT - 7 tokens at most (admitted)
        new = max(7 - k, 2)  # only the last round matters: it starts CONTEXT - k - 2 tokens in
        prompt = [1] + torch.randint(4, 64, (CONTEXT - k - new - 1,), generator=gen).tolist()
        batch.append({"rid": f"end-{k}", "input_ids": prompt, "max_new_tokens": new})
    rounds = [
        batch,
        [{"rid": "too-long", "input_ids": [1] * (CONTEXT - 7), "max_new_tokens": 8}],
        [{"rid": "after", "input_ids": PROMPTS["a"][0], "max_new_tokens": 8}],
    ]
    engine = {"context_length": CONTEXT, "max_total_tokens": 8192}
    trace = tmp_path / "trace.jsonl"
    plain = serve(root, "NONE", rounds, None, None, engine_args=engine)
    spec = serve(root, "REANCHOR", rounds, NEAR_END_CONFIG, trace, engine_args=engine)
    for r in batch:
        rid, p = r["rid"], len(r["input_ids"])
        want = min(r["max_new_tokens"], CONTEXT - 2 - p)  # SGLang's cap
        assert len(plain[rid].get("output_ids", ())) == want, (rid, plain[rid])
        assert spec[rid].get("output_ids") == plain[rid]["output_ids"], (rid, spec[rid])
    assert "context length" in plain["too-long"]["error"] and "context length" in spec["too-long"]["error"]
    assert spec["after"]["output_ids"] == plain["after"]["output_ids"]
    assert max(json.loads(line)["seq_len"] for line in trace.read_text().splitlines()) >= CONTEXT - 6

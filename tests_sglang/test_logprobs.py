"""Logprobs of REANCHOR requests inside SGLang on CPU, against plain SGLang and the target itself.

- T=0, one mixed batch (with and without logprobs, top logprobs, token-id logprobs,
  several ``logprob_start_len``, a penalised request): tokens and every logprob
  field equal plain SGLang's, on the tiny pair whose accepted paths run through
  shifted rows (so an emitted token's row is a node deep in the tree, not a chain
  position);
- T>0: the output logprobs of sampled REANCHOR answers equal the target's own
  ``log_softmax(logits / T)`` at each emitted position (computed with
  transformers), whatever the tree the token came from.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_serving_cpu import PROMPTS, pair, serve  # noqa: F401  (pair: the module fixture)

OFFSET = '{"policy": "offset"}'  # this pair accepts through shifted rows under the offset policy
ROOTS = '{"policy": "offset", "batch_node_budget": 1}'  # every round the root alone: the target's decode step
PROBES = [1, 2, 10, 33]  # token_ids_logprob


def _requests() -> list[dict]:
    batch = []
    for i, (key, (prompt, _)) in enumerate(PROMPTS.items()):
        batch += [
            {"rid": f"{key}-all", "input_ids": prompt, "max_new_tokens": 20, "return_logprob": True,
             "top_logprobs_num": 3, "token_ids_logprob": PROBES, "logprob_start_len": i},
            {"rid": f"{key}-plain", "input_ids": prompt, "max_new_tokens": 20, "return_logprob": True},
            {"rid": f"{key}-none", "input_ids": prompt, "max_new_tokens": 20},
        ]
    batch.append({"rid": "penalised", "input_ids": PROMPTS["a"][0], "max_new_tokens": 20, "return_logprob": True,
                  "top_logprobs_num": 2, "sampling": {"frequency_penalty": 0.9}})
    return batch


def _close(a, b, tol: float = 1e-4) -> bool:
    """Two SGLang logprob fields agree: entries ``[logprob, token_id, text]``, nested in lists, None for none."""
    if a is None or b is None:
        return a is None and b is None
    if len(a) == 3 and isinstance(a[1], int):  # one entry
        return a[1] == b[1] and (a[0] is None and b[0] is None or abs(a[0] - b[0]) <= tol)
    return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))


@pytest.mark.parametrize("config", [OFFSET, ROOTS], ids=["trees", "roots-alone"])
def test_logprobs_equal_plain_sglang(pair, tmp_path, config):
    """Trees whose accepted paths run through shifted rows, and rounds of the root alone
    (the worker's plain decode step, `ReAnchorWorker._decode_roots`)."""
    root, _, _ = pair
    batch = _requests()
    trace = tmp_path / "trace.jsonl"
    plain = serve(root, "NONE", [batch], None, None, engine_args={"disable_overlap_schedule": True})
    spec = serve(root, "REANCHOR", [batch], config, trace)
    fields = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs",
              "input_token_ids_logprobs", "output_token_ids_logprobs")
    for r in batch:
        got, want = spec[r["rid"]], plain[r["rid"]]
        assert got["output_ids"] == want["output_ids"], r["rid"]
        for field in fields:
            assert _close(got.get(field), want.get(field)), (r["rid"], field)
        if r.get("return_logprob"):
            assert len(got["output_token_logprobs"]) == 20
            assert [t[1] for t in got["output_token_logprobs"]] == got["output_ids"]
            start = r.get("logprob_start_len", len(r["input_ids"]))  # unset: no input logprobs
            assert len(got["input_token_logprobs"]) + start == got["prompt_tokens"], r["rid"]  # SpecLogprobKit's rule
        else:
            assert "output_token_logprobs" not in got
    assert len(spec["a-all"]["output_top_logprobs"][5]) == 3
    assert {t[1] for t in spec["b-all"]["output_token_ids_logprobs"][7]} == set(PROBES)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    if config == ROOTS:
        assert rows and all(row["nodes"] == 1 for row in rows)  # every round verified its root alone
        return
    assert sum(row["shifted_accepts"] for row in rows) > 0  # emitted tokens came from shifted rows
    assert max(row["tau"] for row in rows) >= 3  # ... and from deep nodes


@pytest.mark.parametrize("temperature,config", [(1.0, OFFSET), (0.7, OFFSET), (0.7, ROOTS)],
                         ids=["t1-trees", "t0.7-trees", "t0.7-roots-alone"])
def test_sampled_logprobs_are_the_targets(pair, temperature, config):
    root, target, _ = pair
    batch = [{"rid": f"{key}-{j}", "input_ids": prompt, "max_new_tokens": 16, "temperature": temperature,
              "return_logprob": True, "top_logprobs_num": 2, "sampling": {"top_k": 20, "top_p": 0.9}}
             for j in range(2) for key, (prompt, _) in PROMPTS.items()]
    spec = serve(root, "REANCHOR", [batch], config, None)
    for r in batch:
        got = spec[r["rid"]]
        ids = r["input_ids"] + got["output_ids"]
        with torch.no_grad():
            logits = target(torch.tensor([ids])).logits[0, len(r["input_ids"]) - 1: -1].double()
        want = torch.log_softmax(logits / temperature, dim=-1)  # unfiltered, as SGLang returns them
        emitted = torch.tensor(got["output_ids"])
        values = torch.tensor([t[0] for t in got["output_token_logprobs"]], dtype=torch.float64)
        assert torch.allclose(values, want.gather(1, emitted[:, None]).squeeze(1), atol=1e-3), r["rid"]
        top = want.topk(2, dim=-1)
        for pos, entries in enumerate(got["output_top_logprobs"]):
            assert [t[1] for t in entries] == top.indices[pos].tolist(), (r["rid"], pos)
            assert torch.allclose(torch.tensor([t[0] for t in entries], dtype=torch.float64),
                                  top.values[pos], atol=1e-3)

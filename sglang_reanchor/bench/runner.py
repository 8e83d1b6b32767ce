"""Run every method on the same prompts, interleaved per prompt, and record each response.

For each sample and each of its turns, every method generates from the same
token ids with the same settings and seed, in an order rotated per prompt so
machine noise and cache warmth hit all methods alike. The conversation then
continues with the *first listed* method's answer (identical for all methods at
T = 0), so later turns are the same prompt for everyone.

With ``trace`` the engine records every round (`RoundTrace`) and the analysis
counts of `analysis.py` are computed at once and kept in ``Record.stats``; the
traces themselves are dropped. ``diagnostic`` samples also get one untimed
`analysis.DiagnosticProposer` pass (Table 8), recorded under the method ``"diagnostic"``.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..budget import SpeculationGate
from ..config import ReAnchorConfig
from ..drafter import DFlashDrafter
from ..drafter.draft_vocab import top_tokens
from ..engine import GenerationResult, SpeculativeGenerator
from ..engine.packed_linear import pack_linears
from . import analysis
from .cost import CostProfile
from .datasets import Sample
from .methods import MethodSpec
from .metrics import Record, token_hash

__all__ = ["BenchSettings", "Runner", "BUDGETS", "CAPPED_BUDGETS", "DEPTHS"]

Encode = Callable[[list[dict[str, str]]], list[int]]
Decode = Callable[[list[int]], str]
BUDGETS: tuple[int, ...] = (16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128)
# depth caps (ReAnchorConfig.max_depth) the cost model predicts from traced rounds, and
# the node budgets it pairs them with (a capped tree is small)
DEPTHS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
CAPPED_BUDGETS: tuple[int, ...] = (2, 4, 6, 8, 10, 12, 16, 20, 24, 32)


@dataclass(frozen=True)
class BenchSettings:
    """Sampling and bookkeeping settings shared by every method of a run."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    trace: bool = True  # record analysis counts (Tables 1, 5; budget curve)
    diagnostic: int = 0  # samples per dataset that also get the Table 8 pass
    warmup: bool = True


class Runner:
    """Holds one target/drafter pair and a generator per method config.

    Parameters
    ----------
    target, drafter:
        A Hugging Face causal LM and a `DFlashDrafter` for it (shared by every method).
    specs:
        The methods to compare.
    base_config:
        ReAnchor config the specs' changes apply to.
    encode, decode:
        Chat messages -> prompt token ids (chat template applied); new ids -> text.
    profile:
        Measured costs; required by ``node_budget=auto`` specs (their budget policy).
    drafters:
        Further drafters by name, for specs with ``drafter=NAME``.
    """

    def __init__(self, target: torch.nn.Module, drafter: DFlashDrafter, specs: Sequence[MethodSpec],
                 base_config: ReAnchorConfig, encode: Encode, decode: Decode, settings: BenchSettings,
                 profile: CostProfile | None = None, drafters: dict[str, DFlashDrafter] | None = None) -> None:
        if not specs:
            raise ValueError("at least one method is needed")
        named = {None: drafter, **(drafters or {})}
        self.specs = list(specs)
        self.encode, self.decode, self.settings = encode, decode, settings
        self.generators = {}
        self._targets: dict[str, torch.nn.Module] = {}  # a method's precision string -> its target
        self._copies: dict[torch.dtype, torch.nn.Module] = {}
        self.dtypes: dict[str, str] = {}  # label -> its precision, "-packed" added for packed linears
        # (precision, packed) -> the target; a copy where a method's differs from the run's
        targets: dict[tuple[torch.dtype, bool], torch.nn.Module] = {(target.dtype, False): target}
        pairs: dict[tuple[torch.dtype, bool, str | None], tuple[torch.nn.Module, DFlashDrafter]] = {}
        for s in specs:
            if s.drafter not in named:
                raise ValueError(f"method {s.label!r}: no drafter named {s.drafter!r} (--extra-drafter NAME=DIR; "
                                 f"given: {', '.join(str(k) for k in named if k is not None) or 'none'})")
            dtype = getattr(torch, s.dtype) if s.dtype else target.dtype
            if (dtype, s.packed) not in targets:
                targets[(dtype, s.packed)] = _copy(target, dtype, s.packed)
            key = (dtype, s.packed, s.drafter)
            if key not in pairs:
                own = named[s.drafter]
                same = own.fc.weight.dtype == dtype and not s.packed
                pairs[key] = (targets[(dtype, s.packed)], own if same else _copy(own, dtype, s.packed))
            drafter_s = pairs[key][1]
            self.dtypes[s.label] = str(dtype).removeprefix("torch.") + ("-packed" if s.packed else "")
            self._targets[self.dtypes[s.label]] = targets[(dtype, s.packed)]
            config, policy = s.config(base_config), None
            if s.auto_budget:
                if profile is None:
                    raise ValueError(f"method {s.label!r}: node_budget=auto needs a cost profile "
                                     "(--profile cost_profile.json, from `python -m sglang_reanchor.bench cost`)")
                policy = profile.budget_policy(config.offsets)
            vocab = None
            if s.draft_vocab is not None:
                if drafter_s.vocab_ranking is None:
                    raise ValueError(f"method {s.label!r}: the drafter folder has no draft_vocab.safetensors "
                                     "(write one with `python -m sglang_reanchor.train draft-vocab`)")
                vocab = top_tokens(drafter_s.vocab_ranking, s.draft_vocab, "the drafter's draft vocabulary")
            self.generators[s.label] = SpeculativeGenerator(*pairs[key], config, budget_policy=policy,
                                                            draft_vocab=vocab,
                                                            gate=SpeculationGate() if s.gate else None)
        self.diagnostic = analysis.diagnostic_generator(target, drafter, base_config)

    def run(self, samples: Sequence[Sample], desc: str = "bench") -> list[Record]:
        """Every method on every turn of every sample; returns one `Record` per response."""
        if self.settings.warmup:
            self._warmup()
        records: list[Record] = []
        per_dataset: dict[str, int] = {}
        for i, sample in enumerate(tqdm(samples, desc=desc, unit="sample")):
            k = per_dataset[sample.dataset] = per_dataset.get(sample.dataset, -1) + 1
            records += self.run_sample(sample, order_shift=i, diagnostic=k < self.settings.diagnostic)
        return records

    def run_sample(self, sample: Sample, order_shift: int = 0, diagnostic: bool = False) -> list[Record]:
        messages: list[dict[str, str]] = list(sample.history)
        out: list[Record] = []
        n = len(self.specs)
        order = [self.specs[(order_shift + j) % n] for j in range(n)]
        for turn, text in enumerate(sample.turns):
            messages.append({"role": "user", "content": text})
            ids = self.encode(messages)
            seed = self.settings.seed + 1000 * turn + zlib.crc32(sample.id.encode()) % 1000
            answers: dict[str, GenerationResult] = {}
            first = len(out)  # this turn's records start here
            for spec in order:
                result = self._generate(self.generators[spec.label], ids, spec.method, seed)
                answers[spec.label] = result
                out.append(_record(sample, turn, spec.label, result, self.dtypes[spec.label]))
            if diagnostic:
                result = self._generate(self.diagnostic, ids, "reanchor", seed)
                rec = _record(sample, turn, "diagnostic", result, self.dtypes[self.specs[0].label])
                out.append(rec)
            self._explain_divergences(ids, answers, out[first:])
            reply = answers[self.specs[0].label]
            messages.append({"role": "assistant", "content": self.decode(reply.tokens)})
        return out

    def _explain_divergences(self, ids: list[int], answers: dict[str, GenerationResult],
                             records: list[Record]) -> None:
        """At T=0, where a method's tokens leave plain decoding's in the same precision,
        store the position and the target's logit gap between the two tokens there, in
        that precision and in float32 (``stats["divergence"]``): a gap near 0 is a
        near-tie that a tree verify and a one-token forward round differently."""
        if self.settings.temperature != 0:
            return
        plain = {self.dtypes[s.label]: answers[s.label] for s in self.specs if s.method == "target"}
        for rec in records:
            ref = plain.get(rec.dtype)
            if rec.method == "diagnostic" or ref is None or rec.token_ids == ref.tokens:
                continue
            a, b = ref.tokens, rec.token_ids
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if n is None:  # one is a prefix of the other (a stop token)
                continue
            prefix = torch.tensor([ids + a[:n]])
            gaps = {}
            for dtype in (rec.dtype, "float32"):
                model = self._model_in(dtype)
                with torch.inference_mode():
                    logits = model(input_ids=prefix.to(model.device), logits_to_keep=1).logits[0, -1].float()
                gaps[f"gap_{dtype}"] = float(logits[a[n]] - logits[b[n]])
            rec.stats["divergence"] = {"position": n, "plain_token": a[n], "method_token": b[n], **gaps}

    def _model_in(self, dtype: str) -> torch.nn.Module:
        """The target in ``dtype`` (a method's precision string; a cached copy when no method runs in it)."""
        if dtype in self._targets:
            return self._targets[dtype]
        want = getattr(torch, dtype.removesuffix("-packed"))
        if want not in self._copies:
            self._copies[want] = copy.deepcopy(next(iter(self.generators.values())).target.model).to(want)
        return self._copies[want]

    def _generate(self, gen: SpeculativeGenerator, ids: list[int], method: str, seed: int) -> GenerationResult:
        s = self.settings
        return gen.generate(ids, s.max_new_tokens, method=method,  # type: ignore[arg-type]
                            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=seed,
                            trace=s.trace and method != "target")

    def _warmup(self) -> None:
        ids = self.encode([{"role": "user", "content": "Hello!"}])
        for spec in self.specs:
            self.generators[spec.label].generate(ids, 8, method=spec.method)  # type: ignore[arg-type]


def _copy(model: torch.nn.Module, dtype: torch.dtype, packed: bool) -> torch.nn.Module:
    """A copy of ``model`` in ``dtype``, its float32 CPU linears packed if ``packed`` (`engine.packed_linear`)."""
    out = copy.deepcopy(model).to(dtype)
    if packed and not pack_linears(out):
        raise ValueError("packed=1: this torch build or device has no oneDNN packed float32 CPU linears")
    return out


def _record(sample: Sample, turn: int, label: str, result: GenerationResult, dtype: str) -> Record:
    stats: dict[str, dict[str, int]] = {}
    if result.rounds is not None:
        rounds = result.rounds
        stats["agreement"] = analysis.post_rejection_agreement(rounds)
        stats["alignment"] = analysis.start_token_alignment(rounds)
        if label == "diagnostic":
            stats["earliest_win"] = analysis.earliest_win(rounds)
        taus = analysis.budget_taus(rounds, BUDGETS)
        stats["budget_tau"] = {str(b): sum(t) for b, t in taus.items()}
        stats["budget_nodes"] = {str(b): sum(min(int(r.tree.num_nodes[0]), b) for r in rounds) for b in BUDGETS}
        capped = analysis.capped_taus(rounds, CAPPED_BUDGETS, DEPTHS)  # keys "budget@depth"
        stats["capped_tau"] = {f"{b}@{m}": t for (b, m), (t, _) in capped.items()}
        stats["capped_nodes"] = {f"{b}@{m}": k for (b, m), (_, k) in capped.items()}
    rounds_n = len(result.acceptance_lengths) if result.method != "target" else len(result.tokens)
    return Record(
        dataset=sample.dataset, sample=sample.id, turn=turn, method=label, tokens=len(result.tokens),
        taus=list(result.acceptance_lengths), seconds=result.seconds, prefill_seconds=result.prefill_seconds,
        rounds=rounds_n, plain_steps=result.plain_steps, tree_sizes=list(result.tree_sizes), shifted_accepts=list(result.shifted_accepts),
        stats=stats, finish_reason=result.finish_reason, dtype=dtype,
        token_hash=token_hash(list(result.tokens)), token_ids=list(result.tokens),
    )

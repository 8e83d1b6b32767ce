"""`SpeculativeGenerator`: the reference ReAnchor engine over Hugging Face models.

The decoding loop is `SpeculativeGenerator._speculate`; read it top to bottom:
prefill -> propose (a `Proposer`: one drafter forward, then the tree) -> verify (one
target forward over every node) -> accept -> commit (keep the accepted path's KV and
features, store the rejected suffix) -> stop check. The device steps are the round
core's (`sglang_reanchor.round`), the same ones SGLang's worker runs.

Methods: ``"target"`` (plain decoding with a KV cache), ``"dflash"`` (`ChainProposer`:
the baseline block verified as a chain) and ``"reanchor"`` (`ReAnchorProposer`:
baseline plus shifted blocks, verified as a tree); ``self.proposers`` maps the names. ``config.max_depth`` caps both at that many drafts deep. All three emit exactly the target's tokens at T=0 and the
target's distribution at T>0; only the speed differs.

With a `BudgetPolicy` (``budget_policy=``), ReAnchor picks each round's node budget
from a measured cost model and the request's own acceptance so far
(`sglang_reanchor.budget`) instead of ``config.node_budget``.

With a `SpeculationGate` (``gate=``; `from_pretrained` sets one on a CPU when it chooses
the settings), a request runs plain decode steps while its speculative rounds, timed by
the engine, yield fewer tokens per second than plain decoding would; probe rounds bring it
back when its text gets easier to draft. Plain steps are the target's own: the output is
the same.

``generate(..., trace=True)`` also records every verify round (`RoundTrace`: the
tree, the drafted blocks, the target's top-1 at every node, the accepted path) for
the benchmark's analyses (`sglang_reanchor.bench.analysis`); off by default, when
it costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from ..budget import BudgetPolicy, SpeculationGate
from ..config import ReAnchorConfig
from ..drafter import DFlashDrafter, DraftContextCache, DraftVocabHead
from ..drafter.draft_vocab import top_tokens
from ..sampling import SamplingParams, TokenDraw
from ..round import CommitPlan, RoundCore
from ..suffix import SuffixStore
from ..tree import DraftTree
from ..verify import Acceptance
from .defaults import DeviceChoice, device_config, fitting_candidates, pair_fingerprint
from .proposers import ChainProposer, Draft, Drafting, Proposer, ReAnchorProposer
from .target import TargetModel

__all__ = ["METHODS", "GenerationResult", "LinearPacking", "RoundTrace", "SpeculativeGenerator"]

Method = Literal["target", "dflash", "reanchor"]
METHODS: tuple[str, ...] = ("target", "dflash", "reanchor")
PROPOSERS: dict[str, Callable[[Drafting], Proposer]] = {"dflash": ChainProposer, "reanchor": ReAnchorProposer}
ENGINE_SLOTS = 64  # concurrent generate() calls holding a rejected suffix (bounded by config.max_requests)


@dataclass(frozen=True)
class RoundTrace:
    """One verify round of one request (``generate(..., trace=True)``); tensors on CPU.

    Node ``i`` of ``tree`` sits at position ``seq_len + tree.depth[0, i]``; nodes
    ``0..B-1`` are the baseline chain ``blocks[0]``. ``top1[i]`` is the target's
    argmax after node ``i`` given its root path, rejected nodes included.
    """

    seq_len: int  # s: committed tokens whose KV was cached before the round (the root's position)
    tree: DraftTree  # batch 1: the verified tree (a chain for "dflash")
    blocks: Tensor  # [1 + R, 1 + n] long: row 0 = bonus + n baseline drafts; row r = anchor a_d + drafts
    offsets: tuple[int, ...]  # [R]: offset d of shifted row r (empty for "dflash")
    rejected_tokens: Tensor  # [L] long: the previous round's rejected suffix tokens r[s..s+L-1]
    top1: Tensor  # [N] long: target argmax after every node
    next_tokens: Tensor  # [N] long: the target's pick at every node (== top1 at T=0)
    accepted_nodes: Tensor  # [tau] long: accepted node ids, root first

    @property
    def accept_length(self) -> int:
        """tau of the round: accepted drafts + 1 (the bonus)."""
        return int(self.accepted_nodes.shape[0])


@dataclass
class GenerationResult:
    """What one `generate` call produced, and how fast."""

    tokens: list[int]  # new token ids (the prompt excluded), EOS included if reached
    acceptance_lengths: list[int]  # per verify round: accepted drafts + 1 (empty for "target")
    method: str
    finish_reason: str  # "eos" or "length"
    prompt_tokens: int
    prefill_seconds: float
    decode_seconds: float
    tree_sizes: list[int] = field(default_factory=list)  # verified nodes per round
    shifted_accepts: list[int] = field(default_factory=list)  # per round: accepted nodes made by shifted rows
    branch_accepts: list[int] = field(default_factory=list)  # per round: accepted nodes made by branches
    rounds: list[RoundTrace] | None = None  # per verify round, only with generate(..., trace=True)
    plain_steps: int = 0  # plain decode steps a `SpeculationGate` ran instead of rounds (not in the lists above)

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        """End-to-end: new tokens over prefill + decode time."""
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Mean tau over rounds (1.0 for plain decoding: one token per target forward)."""
        taus = self.acceptance_lengths
        return sum(taus) / len(taus) if taus else 1.0


@dataclass(frozen=True)
class LinearPacking:
    """Whether ``from_pretrained`` packed the pair's linears (`engine.packed_linear`), and the speedup
    of packed kernels it measured on this machine's linear shapes (None: not measured)."""

    packed: bool
    speedup: float | None


@dataclass
class _Request:
    """Per-request decoding state (one sequence)."""

    slot: int  # its row of the suffix store
    cache: DynamicCache  # the target's cache, holding positions [0, seq_len)
    draft_cache: DraftContextCache  # drafter context K/V, positions [0, seq_len)
    seq_len: int  # s: committed tokens whose KV is cached
    bonus: int  # the committed token at position s (its KV not cached yet)


class SpeculativeGenerator:
    """ReAnchor / DFlash speculative decoding over a Hugging Face causal LM.

    Parameters
    ----------
    target:
        A Hugging Face ``*ForCausalLM`` (Llama and Qwen3 families tested).
    drafter:
        A `DFlashDrafter` built for this target (checked on construction).
    config:
        ReAnchor settings (offsets, attachment policy, node budget, ...).
    tokenizer:
        Optional; exposed as ``.tokenizer`` for users and the demo.
    budget_policy:
        Optional; ReAnchor then chooses each round's node budget with it
        (`sglang_reanchor.budget`), overriding ``config.node_budget``.
    draft_vocab:
        Optional ``[K]`` token ids: drafts are the argmax over these tokens only
        (`DraftVocabHead`, e.g. ``drafter.vocab_ranking[:K]``), a ``K / V`` share of the
        drafter's LM-head work. The output is unchanged; only the drafts differ.
    proposers:
        Optional ``{method: Proposer class}`` replacing or adding drafting methods
        (`sglang_reanchor.engine.proposers`); the defaults are ``"dflash"`` and ``"reanchor"``.
    gate:
        Optional; speculative methods then run plain decode steps while speculation does not
        pay on this request (`SpeculationGate`). The output is unchanged.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: DFlashDrafter,
        config: ReAnchorConfig | None = None,
        tokenizer: object | None = None,
        budget_policy: BudgetPolicy | None = None,
        draft_vocab: Tensor | None = None,
        proposers: Mapping[str, Callable[[Drafting], Proposer]] | None = None,
        gate: SpeculationGate | None = None,
    ) -> None:
        drafter.validate_target(target.config)
        self.target = TargetModel(target, tuple(drafter.target_layer_ids))
        self.config = config or ReAnchorConfig()
        self.config_choice = DeviceChoice(self.config, "given")  # from_pretrained(config=None) sets where from
        self.linear_packing = LinearPacking(False, None)  # from_pretrained sets it
        self._sampled: SpeculativeGenerator | None = None  # the device's choice for T > 0, built on first use
        if self.config.draft_vocab is not None:
            if draft_vocab is not None:
                raise ValueError("pass draft_vocab= or ReAnchorConfig.draft_vocab, not both")
            ranking = getattr(drafter, "vocab_ranking", None)
            if ranking is None:
                raise ValueError(f"ReAnchorConfig.draft_vocab={self.config.draft_vocab}: the drafter has no draft "
                                 "vocabulary (its folder's draft_vocab.safetensors, `train draft-vocab`)")
            draft_vocab = top_tokens(ranking, self.config.draft_vocab, "the drafter's draft vocabulary")
        lm_head = self.target.lm_head
        self.draft_head = lm_head if draft_vocab is None else DraftVocabHead(lm_head, draft_vocab)
        self.drafter = drafter.to(device=self.target.device).eval()
        self.tokenizer = tokenizer
        self.budget_policy = budget_policy
        self.gate = gate
        self._tree_rng = torch.Generator().manual_seed(self.config.seed)
        # query slots per block, and drafts read from them: nodes past max_depth are never verified
        block = drafter.block_size
        if self.config.draft_slots is not None and self.config.draft_slots > block:
            raise ValueError(f"ReAnchorConfig.draft_slots ({self.config.draft_slots}) exceeds the drafter's "
                             f"block_size ({block})")
        self._num_slots = self.config.draft_slots
        width = self._num_slots or block
        self._num_drafts = min(self.config.max_depth or width - 1, width - 1)
        self._eos = self._eos_ids()
        dev = self.target.device
        self.core = RoundCore(self.config, self._num_drafts, dev)
        # one suffix slot per concurrent generate() call, up to config.max_requests of them
        self.suffixes = SuffixStore(min(self.config.max_requests, ENGINE_SLOTS), self.config.max_offset,
                                    drafter.fc.in_features, device=dev, dtype=self.target.dtype)
        self._free_slots = list(range(self.suffixes.num_slots))
        drafting = Drafting(self.drafter, self.target.embed_tokens, self.draft_head, self.core, self.suffixes,
                            self._num_drafts, self._num_slots)
        # the drafting methods by name ("target" has none: plain decoding)
        self.proposers: dict[str, Proposer] = {name: make(drafting) for name, make in
                                               {**PROPOSERS, **(proposers or {})}.items()}
        # On a CPU a host read costs nothing and every padding node is a verified token: trees are
        # cut to their real width there. Elsewhere the round keeps its fixed shapes.
        self._trim_trees = dev.type == "cpu"

    @classmethod
    def from_pretrained(
        cls,
        target: str | Path | None = None,
        drafter: str | Path | None = None,
        device: str | torch.device | None = None,
        config: ReAnchorConfig | None = None,
        dtype: torch.dtype | str | None = "auto",
        gate: bool | None = None,
        pack_linears: bool | None = None,
    ) -> SpeculativeGenerator:
        """Load a Hugging Face target folder and a z-lab-format drafter folder.

        With no ``target`` this loads the CPU default, SmolLM2-135M-Instruct (see
        `sglang_reanchor.hub`); with no ``drafter``, the drafter shipped for it.
        ``dtype="auto"`` runs both in bfloat16 on CUDA and on CPUs with AMX / AVX-512
        BF16, else in float32 (`sglang_reanchor.precision`); None keeps the target
        folder's stored dtype.

        With no ``config`` the settings are chosen for the device (`engine.defaults`): the
        paper's (``ReAnchorConfig()``) on a GPU; on a CPU the fastest of a few small trees
        on this machine (shipped with the drafter, cached, or measured once, under a
        minute on a 2-core CPU), and for sampled requests (``temperature`` > 0) the choice
        measured at a temperature where one ships. ``.config_choice`` says which and where it came from; pass
        ``config=ReAnchorConfig()`` for the paper's settings anywhere.

        ``gate`` (a `SpeculationGate`: plain decode steps while speculation does not pay on a
        request): None sets one where the settings are chosen for a CPU, True / False everywhere.
        ``pack_linears``: pack the float32 CPU linear layers of target and drafter once for
        oneDNN (`engine.packed_linear`: same logits, faster few-token forwards on AVX2 CPUs);
        None packs them where `packing_speedup` measures it paying on this machine (before the
        settings are chosen, so they are measured on the packed pair). ``.linear_packing`` holds
        that speedup (None where nothing was measured) and whether the pair was packed.
        """
        from ..hub import default_drafter, load_target, shipped_drafter_path
        from ..precision import parse_dtype

        if dtype is not None:
            dtype = parse_dtype(dtype, device)
        model, tokenizer = load_target(target, device=device, dtype=dtype)
        if drafter is None:
            if target is not None:
                raise ValueError("drafter=None is only allowed with the default target; pass a drafter folder")
            draft = default_drafter(model, device=model.device, dtype=model.dtype)
            folder: Path | None = shipped_drafter_path()
        else:
            draft = DFlashDrafter.from_pretrained(drafter, device=model.device, dtype=model.dtype)
            folder = Path(drafter)
        packing = LinearPacking(False, None)
        if pack_linears is not False:
            from .packed_linear import PAYS, pack_linears as pack, packing_speedup

            speedup = packing_speedup(model, draft) if pack_linears is None else None
            if pack_linears or (speedup is not None and speedup >= PAYS):
                packing = LinearPacking(pack(model) + pack(draft) > 0, speedup)
            else:
                packing = LinearPacking(False, speedup)
        choice = DeviceChoice(config, "given") if config is not None else device_config(
            lambda c: cls(model, draft, config=c, tokenizer=tokenizer), model.device, model.dtype, folder,
            pair_fingerprint(model, draft), tokenizer, candidates=fitting_candidates(draft))
        if gate is None:
            gate = config is None and model.device.type == "cpu"
        gen = cls(model, draft, config=choice.config, tokenizer=tokenizer, gate=SpeculationGate() if gate else None)
        gen.config_choice = choice
        gen.linear_packing = packing
        return gen

    def with_config(self, config: ReAnchorConfig) -> SpeculativeGenerator:
        """A generator over the same target and drafter (no copy) with other settings."""
        gen = type(self)(self.target.model, self.drafter, config=config, tokenizer=self.tokenizer, gate=self.gate)
        gen.linear_packing = self.linear_packing
        return gen

    # ---- public API ---------------------------------------------------------------

    def generate(
        self,
        input_ids: Sequence[int] | Tensor,
        max_new_tokens: int,
        method: Method = "reanchor",
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        trace: bool = False,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (a list or ``[1, P]``).

        ``trace=True`` fills ``GenerationResult.rounds`` with one `RoundTrace` per
        verify round (an extra argmax over the verified logits per round). With ``temperature``
        > 0 and a choice for sampling in ``config_choice.sampled`` (chosen for the device), the
        request runs with that config.
        """
        prompt = self._check_prompt(input_ids, max_new_tokens)
        if method != "target" and method not in self.proposers:
            names = ("target", *self.proposers)
            raise ValueError(f"method must be one of {', '.join(map(repr, names))}; got {method!r}")
        sampled = self.config_choice.sampled
        if temperature > 0 and sampled is not None and method != "target":
            if self._sampled is None:
                self._sampled = self.with_config(sampled.config)
            return self._sampled.generate(prompt, max_new_tokens, method, temperature, top_k, top_p, seed, trace)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        # a seed keys every draw by position: the same tokens with every method
        draw = TokenDraw(params, seed=seed) if seed is not None else TokenDraw(
            params, generator=torch.Generator(device=self.target.device).manual_seed(int(torch.randint(2**62, (1,)))))
        # policy="random" draws its sites from here: a given seed reproduces the whole run
        tree_rng = self._tree_rng if seed is None else torch.Generator().manual_seed(
            (self.config.seed * 1_000_003 + seed) % 2**63)
        if not self._free_slots:
            raise RuntimeError(f"{self.suffixes.num_slots} generate() calls already hold a rejected suffix "
                               "(ReAnchorConfig.max_requests caps them)")
        slot = self._free_slots.pop()
        try:
            return self._speculate(prompt, max_new_tokens, method, draw, slot, trace, tree_rng)
        finally:  # finished, failed or interrupted: its state is freed, the slot is free again
            self.suffixes.reset(torch.tensor([slot], device=self.target.device))
            self._free_slots.append(slot)

    # ---- the decoding loop --------------------------------------------------------

    @torch.inference_mode()
    def _speculate(
        self,
        prompt: Tensor,
        max_new: int,
        method: str,
        draw: TokenDraw,
        slot: int,
        trace: bool = False,
        tree_rng: torch.Generator | None = None,
    ) -> GenerationResult:
        t0 = time.perf_counter()
        proposer = self.proposers.get(method)  # None: plain decoding
        req = self._prefill(prompt, draw, slot, with_drafter=proposer is not None)
        out, taus, sizes, shifted_hits, branch_hits = [req.bonus], [], [], [], []
        rows = len(self.config.offsets)  # source rows 1..R are shifted rows, later ones branches
        rounds: list[RoundTrace] | None = [] if trace else None
        budget = self.budget_policy.start() if self.budget_policy and proposer and proposer.uses_budget else None
        gate = self.gate.start() if self.gate and proposer else None
        plain_steps = 0
        t1 = time.perf_counter()
        while not self._finished(out, max_new):
            if proposer is None:
                out.append(self._decode_one(req, draw))
                continue
            started = time.perf_counter()
            if gate and not gate.speculate():  # speculation does not pay here: the target's own step
                out.append(self._decode_one(req, draw, keep_drafter_context=True))
                gate.observe_plain(time.perf_counter() - started)
                plain_steps += 1
                continue
            node_budget = budget.next_budget() if budget else self.config.node_budget
            node_budget = min(node_budget, self.config.batch_node_budget or node_budget)  # batch 1
            # one drafter forward, then one target forward over every node
            tree, draft = proposer.propose(req.draft_cache, req.slot, req.seq_len, req.bonus, node_budget,
                                           tree_rng or self._tree_rng)
            if self._trim_trees:
                tree = tree.trimmed()
            positions = tree.positions(torch.tensor([req.seq_len], device=tree.tokens.device))
            verified = self.target.forward(tree.tokens, positions, req.cache, tree.ancestors[0])
            top1 = verified.logits.argmax(-1)
            picks = top1 if draw.params.greedy else draw(verified.logits[0], positions[0])[None]
            acc = self.core.accept(tree, picks, top1)
            if rounds is not None:
                rounds.append(_trace_round(req.seq_len, tree, draft, acc, verified.logits))
            plan = self.core.commit(tree, acc, torch.tensor([req.seq_len], device=tree.tokens.device))
            taus.append(int(plan.commit_lens[0]))
            out += plan.out_tokens[0, : taus[-1]].tolist()
            assert verified.features is not None  # asked for: the drafter's context
            self._commit(req, acc, plan, verified.features, keep_suffix=proposer.stores_suffix)
            sizes.append(int(tree.num_nodes[0]))
            path = acc.accepted_nodes[0, : taus[-1]]
            source = tree.source_row[0, path]
            shifted_hits.append(int(((source > 0) & (source <= rows)).sum()))
            branch_hits.append(int((source > rows).sum()))
            if budget:
                budget.observe(path, node_budget, sizes[-1])
            if gate:
                gate.observe_round(taus[-1], time.perf_counter() - started)
        tokens, reason = self._truncate(out, max_new)
        return GenerationResult(
            tokens=tokens,
            acceptance_lengths=taus,
            method=method,
            finish_reason=reason,
            prompt_tokens=prompt.shape[1],
            prefill_seconds=t1 - t0,
            decode_seconds=time.perf_counter() - t1,
            tree_sizes=sizes,
            shifted_accepts=shifted_hits,
            branch_accepts=branch_hits,
            rounds=rounds,
            plain_steps=plain_steps,
        )

    # ---- steps --------------------------------------------------------------------

    def _prefill(
        self, prompt: Tensor, draw: TokenDraw, slot: int, *, with_drafter: bool
    ) -> _Request:
        """Run the prompt through the target; sample the first token; seed the drafter context."""
        cache = self.target.new_cache()
        n = prompt.shape[1]
        positions = torch.arange(n)[None]
        out = self.target.forward(prompt, positions, cache, features=with_drafter, last_only=True)
        first = int(draw(out.logits[:, -1], torch.tensor([n - 1], device=out.logits.device))[0])
        draft_cache = DraftContextCache()
        if with_drafter:
            assert out.features is not None
            draft_cache.append(self.drafter.project_context(out.features, positions.to(self.target.device)))
        return _Request(slot=slot, cache=cache, draft_cache=draft_cache, seq_len=n, bonus=first)

    def _decode_one(self, req: _Request, draw: TokenDraw, keep_drafter_context: bool = False) -> int:
        """Plain decoding: feed the last token, sample the next. ``keep_drafter_context``: the
        request speculates again later (a `SpeculationGate`), so the token's features extend the
        drafter's context, and the rejected suffix, now behind the sequence, is dropped."""
        positions = torch.tensor([[req.seq_len]])
        out = self.target.forward(torch.tensor([[req.bonus]]), positions, req.cache, features=keep_drafter_context)
        if keep_drafter_context:
            assert out.features is not None
            req.draft_cache.append(self.drafter.project_context(out.features, positions.to(self.target.device)))
            self.suffixes.reset(torch.tensor([req.slot], device=self.target.device))
        req.seq_len += 1
        req.bonus = int(draw(out.logits[:, -1], torch.tensor([req.seq_len - 1], device=out.logits.device))[0])
        return req.bonus

    def _commit(self, req: _Request, acc: Acceptance, plan: CommitPlan, features: Tensor, keep_suffix: bool) -> None:
        """Keep the accepted path in both caches; store the rejected suffix for the next round."""
        s, t = req.seq_len, int(plan.commit_lens[0])
        path = plan.path_nodes[0, :t]
        self.target.keep_tokens(req.cache, s, path)
        positions = torch.arange(s, s + t, device=self.target.device)[None]
        req.draft_cache.append(self.drafter.project_context(features[:, path], positions))
        req.seq_len, req.bonus = s + t, int(acc.bonus[0])
        if keep_suffix and self.config.max_offset:
            self.suffixes.put(torch.tensor([req.slot], device=self.target.device),
                              *self.core.next_suffix(acc, plan, features))

    # ---- helpers ------------------------------------------------------------------

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.target.model, "generation_config", None), self.target.config):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        return ids

    def _finished(self, out: list[int], max_new: int) -> bool:
        return len(out) >= max_new or not self._eos.isdisjoint(out)

    def _truncate(self, out: list[int], max_new: int) -> tuple[list[int], str]:
        """Cut at the first EOS (kept) and at ``max_new`` tokens."""
        for i, tok in enumerate(out[:max_new]):
            if tok in self._eos:
                return out[: i + 1], "eos"
        return out[:max_new], "length"

    def _check_prompt(self, input_ids: Sequence[int] | Tensor, max_new_tokens: int) -> Tensor:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        ids = input_ids if isinstance(input_ids, Tensor) else torch.tensor(list(input_ids), dtype=torch.long)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ValueError(f"input_ids must be a list of ints or a [1, P] LongTensor, got shape {tuple(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError("input_ids is empty: the prompt needs at least one token")
        if ids.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
        vocab = self.target.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"input_ids must lie in [0, {vocab - 1}] (the target's vocab_size is {vocab})")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        # Trees verify up to 2 * block_size positions past the committed length.
        needed = ids.shape[1] + max_new_tokens + 2 * self.drafter.block_size
        if limit is not None and needed > limit:
            raise ValueError(
                f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + 2 * block_size "
                f"({2 * self.drafter.block_size}) = {needed} exceeds the target's max_position_embeddings ({limit})"
            )
        return ids.long().to(self.target.device)


def _trace_round(seq_len: int, tree: DraftTree, draft: Draft, acc: Acceptance, logits: Tensor) -> RoundTrace:
    """The `RoundTrace` of one verify round (batch 1; ``logits``: ``[1, N, V]``), copied to CPU."""
    cpu = torch.device("cpu")
    t = int(acc.accept_lengths[0])
    blocks, offsets, rejected = draft.valid_rows()
    return RoundTrace(
        seq_len=seq_len,
        tree=tree.to(cpu),
        blocks=blocks[0].to(cpu),
        offsets=tuple(offsets),
        rejected_tokens=rejected[0].to(cpu),
        top1=logits[0].argmax(-1).to(cpu),
        next_tokens=acc.next_tokens[0].to(cpu),
        accepted_nodes=acc.accepted_nodes[0, :t].to(cpu),
    )

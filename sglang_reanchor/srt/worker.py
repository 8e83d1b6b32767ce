"""`ReAnchorWorker`: SGLang's DFlash worker with ReAnchor's decode step.

Imported by SGLang through the plugin (it imports SGLang at the top).

Reused from ``DFlashWorkerV2`` as is: the draft model runner and its KV pool
(sharing the target's slot indices), the target prefill with aux hidden-state
capture and the prompt's draft KV (`forward_batch_generation`'s extend branch),
the TP-safe greedy argmax over the target's vocab-parallel LM head, the mask
token and embedding handling, and the prefix-valid draft KV writer.

Replaced: the decode step (`_decode`), one round per call, in named steps; the
round's device logic is the project's `RoundCore` (``self.core``), as in the engine::

    _begin_round   each request's rejected suffix (by req_pool_idx), node budget, room in its row
    _draft_tree    one drafter forward: baseline + shifted blocks (layout.draft_window), the tree
    _verify        one target forward over every node, FULL_MASK custom mask
                   (_decode_roots instead when every tree is its root alone: the target's plain
                   decode step, no drafter forward, no custom mask, no KV moves)
    _accept_nodes  every node scored with its own path's penalties and grammar state; the
                   acceptance (greedy, or a target sample per node), TP-synced
    core.commit    the commit plan; logprobs and sampling masks of the emitted tokens (outputs)
    _commit        the accepted path's target KV to the front of the window, its features
                   into the draft KV, the new rejected suffix into the store (a root-alone
                   round's features wait in the draft-KV backlog until a round drafts)
    return         GenerationBatchResult (accepted drafts + bonus per request)

The radix cache only ever sees committed tokens: SGLang inserts
``[0, kv_committed_len)``, which advances by ``accept_lens``; rejected nodes stay
in reserved slots past it and are overwritten next round.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
from sglang.srt.runtime_context import get_parallel, get_spec
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
    get_server_return_hidden_states_mode,
)
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
)
from sglang.srt.speculative.draft_worker_common import (
    build_block_pos_offsets,
    make_draft_block_spec_info,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask, draft_tp_context

from ..budget import BatchBudget
from ..drafter.domino import DominoHead
from ..drafter.draft_vocab import DraftVocabHead, load_draft_vocab
from ..drafter.dspark import DSparkHead
from ..drafter.heads import RolloutHead, chosen_prob
from ..round import CommitPlan, DraftAnchors, RoundCore
from ..suffix import SuffixBatch, SuffixStore
from ..tree import DraftTree
from ..verify import Acceptance
from . import seam
from .context_end import RoundRoom, check_reserved, reserved_columns, round_room, set_row_width
from .cpu_compat import needs_cpu_hooks
from .draft_kv_backlog import DraftKVBacklog, backlog_bytes_from_env
from .layout import cap_tree, draft_window, verify_inputs
from .node_sampling import adjust_node_logits, node_picks
from .outputs import RoundTiming, attach_token_outputs, emitted_hidden_states, prefill_hidden_states, write_trace
from .packed_linears import packed_linear_or_none, packs_linears_here
from .request_checks import mark_active
from .settings import COST_PROFILE_ENV, load_config, serving_widths
from .spec import draft_query_width, is_dspark_config

__all__ = ["ReAnchorWorker"]

logger = logging.getLogger(__name__)

TRACE_ENV = "SGLANG_REANCHOR_TRACE"  # a file path: one JSON line per request per round


class DraftWindowInput(DFlashVerifyInput):
    """The drafter forward's spec input: its custom mask also covers the prefix.

    The rejected-suffix context rows sit at the end of the drafter's prefix, and
    only some blocks may see them (`layout.draft_window`). FlashInfer applies the
    whole FULL_MASK row; for Triton, ``masks_prefix`` makes the plugin's hook run
    the kernel without ``skip_prefix_custom_mask`` (`cpu_compat._extend_with_prefix_mask`, `seam`).
    """

    masks_prefix = True


@dataclass(frozen=True)
class _Round:
    """One round's inputs: device tensors ``[bs]``-leading; host numbers named so."""

    bs: int
    slots: torch.Tensor  # [bs] req_pool_idx
    prefix: torch.Tensor  # [bs] long: committed tokens (device)
    seq_lens_cpu: torch.Tensor  # [bs]: the same on the host
    max_prefix: int  # host: the longest prefix (FULL_MASK offsets are computed on the device below it)
    prefix_sum: int  # host: the prefixes' sum (FULL_MASK's size)
    suffix: SuffixBatch | None  # each request's rejected suffix (None: the roots alone read none)
    budget: int  # tree nodes per request this round
    room: RoundRoom  # host: what the row's end leaves for the window and the tree
    expected: dict[int, float] | None = None  # traced: the cost budget's tokens/s per budget at its choice


@dataclass(frozen=True)
class _Verified:
    """The target's verify forward over the tree (``N`` = its width)."""

    logits_output: Any  # SGLang's LogitsProcessorOutput: [bs * N, V] logits, [bs * N, F] features
    loc: torch.Tensor  # [bs, N] KV slots the nodes were written to
    plan: Any  # SGLang's KV index plan of those writes (the draft KV shares its slot ids)
    positions: torch.Tensor  # [bs, N]
    width: int  # N


class ReAnchorWorker(DFlashWorkerV2):
    """The ``REANCHOR`` speculative worker (synchronous: overlap scheduling is off)."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        seam.check_targets()  # every hook target and private attribute the worker uses exists (seam)
        # this process serves REANCHOR: drafter dtype, Triton prefix mask, reservation cap at the row's end
        seam.install("worker", plain_cpu=needs_cpu_hooks())
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        mark_active()  # this scheduler now refuses what REANCHOR cannot serve (request_checks)
        if self.selector is not None or self.lilicorr is not None:
            raise ValueError("REANCHOR drafts with DFlash, Domino and DSpark drafters (no selector or LiLiCorr head)")
        # DFlashWorkerV2 took speculative_num_draft_tokens (our reservation) as the
        # block size; restore the drafter's own query width (a DSpark drafter's may be gamma + 1).
        hf_config = self.draft_model_runner.model_config.hf_config
        self._is_dspark = is_dspark_config(hf_config)
        block = draft_query_width(hf_config)
        self.block_size = block
        self.draft_model.set_block_size(block)
        self._block_pos_offsets = build_block_pos_offsets(length=block, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=block, device=self.device)
        self.reanchor = load_config()
        self.widths = serving_widths(self.reanchor, block)  # its block_size: the draft_slots each block runs
        slots = self.widths.block_size
        self._num_drafts = min(self.reanchor.max_depth or slots - 1, slots - 1)  # drafts read per block
        reserved = int(get_spec().speculative_num_draft_tokens)  # what the launcher resolved (spec.py)
        if reserved < self.widths.reserve_width:  # the launcher resolved another config (settings.py)
            raise ValueError(f"REANCHOR: the launcher reserved {reserved} slots per step, this config needs "
                             f"{self.widths.reserve_width} ({self.reanchor}); set $SGLANG_REANCHOR_CONFIG "
                             "before launching, not in the scheduler's environment alone")
        self.speculative_num_draft_tokens = self.widths.reserve_width
        fc = self.draft_model.fc
        self._feature_dim = int(fc.input_size if getattr(self.draft_model, "quantizable", False) else fc.in_features)
        self._suffixes: SuffixStore | None = None  # built once SGLang has allocated its pools
        # root-alone rounds' draft-KV writes, held while their batch decodes plainly (draft_kv_backlog)
        self._draft_kv_backlog = DraftKVBacklog(self._append_target_hidden_to_draft_kv_by_loc,
                                                max_bytes=backlog_bytes_from_env())
        self._tree_rng = torch.Generator(device="cpu").manual_seed(self.reanchor.seed)
        self.core = RoundCore(self.reanchor, self._num_drafts, self.device, max_nodes=self.widths.verify_nodes,
                              generator=self._tree_rng)
        assert self.core.stride == self.widths.output_stride
        # On a CPU a host read costs nothing and every padding node is a verified token: trees are
        # cut to their real width there (one read a round). On a GPU the round keeps its fixed shapes.
        self._trim_trees = str(self.device) == "cpu"
        self._sample_rng = torch.Generator(device=self.device).manual_seed(self.reanchor.seed)
        # the trace: one line per request per round, written by TP rank 0 (every rank drafts the same tree)
        self._trace_path = os.environ.get(TRACE_ENV, "") if int(get_parallel().tp_rank) == 0 else ""
        # the project's Domino / DSpark rollout where the round reads what SGLang's rollouts do not return:
        # the scores branching picks runner-ups from, the probabilities verify_threshold cuts by (below)
        self._family_head: RolloutHead | None = None
        self._with_probs = self.reanchor.verify_threshold is not None
        if self._is_domino or self._is_dspark:
            family = "Domino" if self._is_domino else "DSpark"
            if self.reanchor.draft_vocab is not None:
                raise ValueError(f"REANCHOR with a {family} drafter: draft_vocab is not served; set it to null "
                                 f"({family}'s rollout corrects drafts over the whole vocabulary, slot after slot)")
            if self.reanchor.branch_width or self._with_probs:
                self._family_head = self._own_family_head()
            if self.reanchor.draft_slots is not None:
                raise ValueError(f"REANCHOR with a {family} drafter: draft_slots is not served (its head is built "
                                 "for whole blocks); set it to null")
        self._check_tp(server_args)
        self._draft_vocab = self._load_draft_vocab(server_args)  # token ids [K] or None
        self._draft_vocab_head: DraftVocabHead | None = None  # built at the first draft (the LM head exists then)
        self._pack_linears = packs_linears_here()  # the draft-vocabulary head packed like the models' linears
        self._batch_budget = self._load_batch_budget()
        # the budget learns this server's own round times where they are host wall time (CPU) and
        # the same for every rank (one rank): on a GPU the timer would need a sync per round
        self._time_rounds = (self._batch_budget is not None and str(self.device) == "cpu"
                             and int(getattr(server_args, "tp_size", 1) or 1) == 1)
        if get_server_return_hidden_states_mode().need_capture():
            # return_hidden_states: the target's logits processor keeps its last hidden states beside
            # the drafter's aux features (SGLang does so only for --enable-return-aux-hidden-states)
            for module in self.target_worker.model_runner.model.modules():
                if isinstance(module, LogitsProcessor):
                    module.keep_last_hidden_states = True
        logger.info("REANCHOR worker: %s; widths %s", self.reanchor, self.widths)

    @property
    def suffixes(self) -> SuffixStore:
        """Rejected suffixes by ``req_pool_idx`` (allocated on first use)."""
        if self._suffixes is None:
            self._suffixes = SuffixStore(
                num_slots=int(self.model_runner.req_to_token_pool.size) + 1,
                max_len=self.widths.extra_rows,
                feature_dim=self._feature_dim,
                device=self.device,
                dtype=self.model_runner.model_config.dtype,
            )
        return self._suffixes

    # ---- the scheduler's entry point ------------------------------------------------

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
                                 pp_proxy_tensors: Any = None) -> GenerationBatchResult:
        set_row_width(self.model_runner.req_to_token_pool.req_to_token.shape[1])  # before any reservation
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            self._draft_kv_backlog.flush()  # a prefill may read the held rows (a radix match) or reuse their slots
            if batch.req_pool_indices is not None and len(batch.req_pool_indices):
                self.suffixes.reset(batch.req_pool_indices)  # prefill: a (re)admitted request has none
            result = super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
            if batch.return_hidden_states and result.logits_output is not None:
                result.logits_output.hidden_states = prefill_hidden_states(batch, result.logits_output)
            return result
        if batch.forward_mode.is_idle() or batch.spec_info is None:
            self._draft_kv_backlog.flush()
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        result = self._decode(batch, grammar_barrier)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    # ---- one ReAnchor round -----------------------------------------------------------

    def _decode(self, batch: Any, grammar_barrier: Any = None) -> GenerationBatchResult:
        """One round: draft a tree, verify it, accept, commit (the module docstring's steps)."""
        start = time.perf_counter()
        rnd = self._begin_round(batch)
        if bool(rnd.room.drafted.any()):
            self._draft_kv_backlog.flush()  # the drafter reads every committed row
            tree = self._draft_tree(batch, rnd)
            grammar_tree = self._grammar_tree(batch, tree)
            verified = self._verify(batch, rnd, tree)
        else:  # every request verifies its root alone (a big batch's budget, the row's end)
            tree = DraftTree.chain(batch.spec_info.bonus_tokens.view(-1, 1))
            grammar_tree = self._grammar_tree(batch, tree)
            verified = self._decode_roots(batch, rnd)
        logits, acc = self._accept_nodes(batch, rnd, tree, verified, grammar_tree, grammar_barrier)
        commit = self.core.commit(tree, acc, rnd.prefix)
        attach_token_outputs(batch, verified.logits_output, logits, commit)
        self._commit(batch, rnd, verified, acc, commit)
        # the scheduler copies these to the host: only for requests that asked for them
        verified.logits_output.hidden_states = (
            emitted_hidden_states(verified.logits_output, commit, rnd.bs, verified.width)
            if batch.return_hidden_states else None)
        if self._trace_path:
            suffix_lens = rnd.suffix.lengths if rnd.suffix is not None else torch.zeros_like(rnd.prefix)
            write_trace(self._trace_path, batch, tree, acc, suffix_lens,
                        RoundTiming(rnd.budget, start, time.perf_counter() - start, rnd.expected))
        if self._time_rounds and self._batch_budget is not None:
            self._batch_budget.record_seconds(rnd.bs, rnd.budget, time.perf_counter() - start)
        return GenerationBatchResult(
            logits_output=verified.logits_output,
            next_token_ids=commit.out_tokens.reshape(-1),
            accept_lens=commit.commit_lens.to(torch.int32),
            can_run_cuda_graph=False,
            next_draft_input=self._make_next_draft_input_decode(bonus_tokens=acc.bonus,
                                                                new_seq_lens=commit.new_seq_lens),
            speculative_num_draft_tokens=self.widths.reserve_width,
            speculative_output_stride=self.widths.output_stride,
            new_seq_lens=commit.new_seq_lens,
        )

    def _begin_round(self, batch: Any) -> _Round:
        """The round's inputs: each request's rejected suffix, node budget and room left in its row."""
        bs = len(batch.seq_lens)
        slots = batch.req_pool_indices
        prefix = batch.seq_lens.long()
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else prefix.cpu()
        row_width = int(self.model_runner.req_to_token_pool.req_to_token.shape[1])
        self.suffixes.retain_only(slots)  # finished, aborted, retracted requests left the batch
        budget = self._round_node_budget(bs)
        # roots alone draft nothing and reject nothing: the suffixes stay, and their starts no longer
        # match the requests' prefixes after this round (`SuffixStore.gather` then finds none)
        suffix = self.suffixes.gather(slots, prefix) if budget > 1 else None
        # near the row's end the window and the tree shrink to the columns left (context_end)
        expected = (self._batch_budget.expected_rates(bs)
                    if self._trace_path and self._batch_budget is not None else None)
        room = round_room(seq_lens_cpu, row_width, self.widths.draft_columns, budget)
        # a short reservation fails here, before any write, not as a write into someone else's slots
        check_reserved(reserved_columns(batch.reqs, seq_lens_cpu), room.writes, batch.reqs)
        return _Round(bs=bs, slots=slots, prefix=prefix, seq_lens_cpu=seq_lens_cpu,
                      max_prefix=int(seq_lens_cpu.max()), prefix_sum=int(seq_lens_cpu.sum()),
                      suffix=suffix, budget=budget, room=room, expected=expected)

    def _draft_tree(self, batch: Any, rnd: _Round) -> DraftTree:
        """The 1 + R blocks of every request in one drafter forward, merged into the tree."""
        assert rnd.suffix is not None  # a round drafts only with a budget > 1 (`round_room`), which gathers it
        anchors = self.core.anchors(batch.spec_info.bonus_tokens.view(-1), rnd.prefix, rnd.suffix,
                                    int(self._mask_token_id))
        blocks, anchors, logits, probs = self._draft(batch, rnd, anchors)
        tree = self.core.tree(blocks, anchors, rnd.suffix, rnd.budget, baseline_logits=logits,
                              token_ids=self._draft_vocab, draft_probs=probs)
        if self._trim_trees:
            tree = tree.trimmed()
        # room lives on the host (from seq_lens_cpu): these checks read no device memory
        cap = int(rnd.room.node_caps.max())
        if not bool(rnd.room.drafted.all()) or cap < tree.width:
            tree = cap_tree(tree, rnd.room.node_caps, width=min(cap, tree.width))
        return tree

    @staticmethod
    def _grammar_tree(batch: Any, tree: DraftTree) -> Any:
        """For grammar requests, the tree's pointers on the host, copied before the verify launch."""
        if not batch.has_grammar:
            return None
        _, next_token, next_sibling = tree.retrieve_arrays()
        return GrammarTree.from_device(next_token, next_sibling, tree.tokens)

    def _verify(self, batch: Any, rnd: _Round, tree: DraftTree) -> _Verified:
        """One target forward over every node of the tree (FULL_MASK custom mask)."""
        vin = verify_inputs(tree, rnd.prefix, max_prefix=rnd.max_prefix, prefix_sum=rnd.prefix_sum)
        width = tree.width
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        loc = req_to_token[rnd.slots[:, None], vin.columns].long()  # [bs, N]
        translator = self.target_worker.model_runner.kv_index_translator
        plan = translator.plan(req_pool_indices=rnd.slots, seq_lens=batch.seq_lens, seq_lens_cpu=rnd.seq_lens_cpu,
                               write_virtual=loc.reshape(-1), read_extent=width)
        verify_input = DFlashVerifyInput(
            draft_token=vin.tokens, positions=vin.positions, draft_token_num=width,
            custom_mask=vin.custom_mask, capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=plan,
        )
        batch.out_cache_loc = loc.reshape(-1)
        backup = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu = rnd.seq_lens_cpu + width
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = backup
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        lp = self._target_logits_processor
        if lp is not None and lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = lp.finish_deferred_gather(logits_output.next_token_logits)
        return _Verified(logits_output=logits_output, loc=loc, plan=plan,
                         positions=vin.positions.view(rnd.bs, width), width=width)

    def _decode_roots(self, batch: Any, rnd: _Round) -> _Verified:
        """The round of a batch whose trees are their roots alone: the target's plain decode step
        (``ForwardMode.DECODE``, one token per request at column ``s``, no custom mask), as plain
        SGLang runs it, its features captured for the draft KV (``width`` 1)."""
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        loc = req_to_token[rnd.slots, rnd.prefix].long()  # [bs]: the root's slot, column s
        # the decode step's view of the batch: the root is the new token (seq_lens count it)
        saved = {f: getattr(batch, f) for f in ("input_ids", "seq_lens", "seq_lens_cpu", "seq_lens_sum",
                                                 "out_cache_loc", "spec_info", "forward_mode")}
        batch.input_ids = batch.spec_info.bonus_tokens.view(-1)
        batch.seq_lens = batch.seq_lens + 1
        batch.seq_lens_cpu = rnd.seq_lens_cpu + 1
        batch.seq_lens_sum = rnd.prefix_sum + rnd.bs
        batch.out_cache_loc = loc
        batch.spec_info = None
        batch.forward_mode = ForwardMode.DECODE
        try:
            forward_batch = ForwardBatch.init_new(batch, self.target_worker.model_runner,
                                                  capture_hidden_mode=CaptureHiddenMode.FULL,
                                                  return_hidden_states_before_norm=False)
        finally:
            for field, value in saved.items():
                setattr(batch, field, value)
        target_out = self.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch,
                                                                 is_verify=True)
        logits_output = target_out.logits_output
        lp = self._target_logits_processor
        if lp is not None and lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = lp.finish_deferred_gather(logits_output.next_token_logits)
        return _Verified(logits_output=logits_output, loc=loc[:, None], plan=forward_batch.kv_loc_plan,
                         positions=rnd.prefix[:, None], width=1)

    def _accept_nodes(self, batch: Any, rnd: _Round, tree: DraftTree, verified: _Verified, grammar_tree: Any,
                      grammar_barrier: Any) -> tuple[torch.Tensor, Acceptance]:
        """Every node scored with its own path's penalties and grammar state (``[bs, N, V]``), then
        the acceptance: the target's pick at every node, greedy or drawn (TP-synced)."""
        logits = adjust_node_logits(verified.logits_output.next_token_logits.view(rnd.bs, verified.width, -1),
                                    tree, batch.reqs, batch.sampling_info)
        if grammar_tree is not None:
            logits = self._mask_by_grammar(batch, grammar_tree, logits, grammar_barrier)
        acc = self._accept(tree, logits, verified.positions, batch.sampling_info)
        if self._batch_budget is not None:  # synced picks: every rank learns the same tau(b)
            self._batch_budget.observe(acc.accepted_nodes, rnd.budget)
        return logits, acc

    def _commit(self, batch: Any, rnd: _Round, verified: _Verified, acc: Acceptance, commit: CommitPlan) -> None:
        """The accepted path's target KV to the front of the window (``bs * T`` moves, identity ones
        included: a fixed-size list), its features into the draft KV, the new rejected suffix out.
        A root-alone round moves nothing, rejects nothing, and its one row per request waits in the
        draft-KV backlog until something reads the draft KV."""
        hidden = verified.logits_output.hidden_states.view(rnd.bs, verified.width, -1)
        write_ids = self._draft_write_ids(verified.plan).view(rnd.bs, verified.width)
        if verified.width == 1:  # copies: SGLang may reuse these buffers before the backlog writes them
            self._draft_kv_backlog.hold(tuple(req.rid for req in batch.reqs), hidden[:, 0].clone(),
                                        write_ids[:, 0].clone(), rnd.prefix.clone())
            return

        window = verified.loc.reshape(-1)
        src, dst = window[commit.move_src], window[commit.move_dst]
        pool = self.model_runner.token_to_kv_pool
        if str(self.device) == "cpu":  # the pool's own mover is a GPU kernel
            move_kv_cache_native(pool.k_buffer, pool.v_buffer, dst, src)
        else:
            pool.move_kv_cache(dst, src)

        dim = hidden.shape[-1]
        path = commit.path_nodes  # [bs, T]
        commit_hidden = hidden.gather(1, path[:, :, None].expand(-1, -1, dim))
        commit_ids = write_ids[:, : path.shape[1]]
        positions = rnd.prefix[:, None] + torch.arange(path.shape[1], device=rnd.prefix.device)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=commit_hidden.reshape(-1, dim), cache_loc=commit_ids.reshape(-1),
            cache_loc_2d=commit_ids, positions=positions.reshape(-1), commit_lens=commit.commit_lens.to(torch.int32),
        )
        self.suffixes.put(rnd.slots, *self.core.next_suffix(acc, commit, hidden))

    @staticmethod
    def _mask_by_grammar(batch: Any, grammar_tree: Any, logits: torch.Tensor, barrier: Any) -> torch.Tensor:
        """``logits`` (``[bs, N, V]``) with each node's row masked by its path's grammar state.

        SGLang's `build_grammar_vocab_mask` walks the tree depth first, advancing each
        request's matcher along a path and rolling it back at a fork, as it does for
        EAGLE trees; a node its parent's mask forbids gets no row (it cannot be accepted:
        the target's pick under the parent's mask never equals it). The scheduler then
        advances the matcher over the committed tokens (`advance_grammar_fsm`).
        """
        bs, width, vocab = logits.shape
        mask = build_grammar_vocab_mask(reqs=batch.reqs, tree=grammar_tree, sampling_info=batch.sampling_info,
                                        device=logits.device, barrier=barrier)
        if mask is None:
            return logits
        rows = logits.reshape(bs * width, vocab).contiguous()
        mask.apply(rows)
        return rows.view(bs, width, vocab)

    def _round_node_budget(self, bs: int) -> int:
        """Tree nodes each of ``bs`` requests may verify this round: ``node_budget``, or what the
        cost profile's `BatchBudget` chooses for ``bs``, or the share of ``batch_node_budget``
        (at least the root): big batches verify short chains; past ``disable_by_batch_size`` requests,
        the roots alone (a plain decode step)."""
        limit = self.reanchor.disable_by_batch_size
        if limit is not None and bs > limit:
            return 1
        nodes = self.widths.verify_nodes
        if self._batch_budget is not None:
            return min(nodes, self._batch_budget.choose(bs))
        if self.reanchor.batch_node_budget is not None:
            nodes = min(nodes, max(1, self.reanchor.batch_node_budget // bs))
        return nodes

    def _load_batch_budget(self) -> BatchBudget | None:
        """``$SGLANG_REANCHOR_COST_PROFILE`` (a ``bench cost`` profile): the batch-aware budget."""
        path = os.environ.get(COST_PROFILE_ENV, "")
        if not path:
            return None
        if self.reanchor.batch_node_budget is not None:
            raise ValueError(f"${COST_PROFILE_ENV} and batch_node_budget both cap the batch's nodes; set one")
        from ..bench.cost import CostProfile  # the benchmark suite: imported only when asked for

        try:
            profile = CostProfile.load(path)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"${COST_PROFILE_ENV}={path!r} is not a cost profile written by "
                             f"`python -m sglang_reanchor.bench cost`: {e}") from e
        served = str(self.model_runner.model_config.dtype).removeprefix("torch.")
        if profile.dtype and profile.dtype != served:
            logger.warning("REANCHOR: cost profile %s was measured in %s, the server runs %s", path,
                           profile.dtype, served)
        packed = packs_linears_here()
        if profile.packed_linears != packed:
            logger.warning("REANCHOR: cost profile %s was measured with %s linears, the server runs %s ones "
                           "($SGLANG_REANCHOR_PACK_LINEARS; `bench cost --pack-linears`)", path,
                           *("packed" if p else "unpacked" for p in (profile.packed_linears, packed)))
        top = self.widths.verify_nodes
        return profile.batch_budget(self.reanchor.offsets, self.reanchor.max_depth,
                                    candidates=tuple(b for b in (2, 4, 8, 16, 32) if b < top) + (top,))

    def _draft(self, batch: Any, rnd: _Round,
               anchors: DraftAnchors) -> tuple[torch.Tensor, DraftAnchors, torch.Tensor | None, torch.Tensor | None]:
        """One drafter forward over the 1 + R blocks of every request with room to draft
        (``rnd.room.drafted``, ``[bs]`` bool on the host).

        Returns ``blocks [bs, 1+R, 1+n]`` long, ``n`` drafts per block (``B - 1``, or ``max_depth``:
        deeper nodes are never verified), the anchors with ``row_valid`` False for a request not
        drafted (its blocks are ``[anchor, MASK...]`` and its tree is cut to the root), with
        branching the baseline block's logits at its slots ``1 .. n`` (``[bs, n, V']``; else None), and
        with ``verify_threshold`` the drafter's probability of each draft (``[bs, 1+R, n]``; else None).
        """
        drafted, prefix, seq_lens_cpu, suffix = rnd.room.drafted, rnd.prefix, rnd.seq_lens_cpu, rnd.suffix
        assert suffix is not None  # gathered for every round that drafts (`_draft_tree`)
        if bool(drafted.all()):
            blocks, logits, probs = self._draft_rows(batch.req_pool_indices, prefix, batch.seq_lens, seq_lens_cpu,
                                                     anchors, suffix)
            return blocks, anchors, logits, probs
        bs, rows = anchors.tokens.shape
        blocks = torch.full((bs, rows, 1 + self._num_drafts), int(self._mask_token_id), dtype=torch.long,
                            device=prefix.device)
        blocks[:, :, 0] = anchors.tokens
        logits = probs = None
        if self._with_probs:  # requests not drafted verify their root alone: any probabilities do
            probs = torch.zeros(bs, rows, self._num_drafts, device=prefix.device)
        if bool(drafted.any()):  # the context end: an eager path (host indices)
            host = drafted.nonzero().squeeze(1)
            idx = host.to(prefix.device)
            part = DraftAnchors(*(getattr(anchors, f)[idx] for f in DraftAnchors.__dataclass_fields__))
            part_suffix = SuffixBatch(*(getattr(suffix, f)[idx] for f in SuffixBatch.__dataclass_fields__))
            blocks[idx], part_logits, part_probs = self._draft_rows(
                batch.req_pool_indices[idx], prefix[idx], batch.seq_lens[idx], seq_lens_cpu[host], part, part_suffix)
            if probs is not None and part_probs is not None:
                probs[idx] = part_probs
            if part_logits is not None:  # requests not drafted verify their root alone: any logits do
                logits = part_logits.new_zeros(bs, *part_logits.shape[1:])
                logits[idx] = part_logits
        if logits is None and self.reanchor.branch_width:
            logits = torch.zeros(bs, self._num_drafts, 2, device=prefix.device)
        valid = anchors.row_valid & drafted.to(prefix.device)[:, None]
        return blocks, DraftAnchors(anchors.tokens, anchors.positions, anchors.visible, valid), logits, probs

    def _draft_rows(self, slots: torch.Tensor, prefix: torch.Tensor, seq_lens: torch.Tensor,
                    seq_lens_cpu: torch.Tensor, anchors: DraftAnchors,
                    suffix: SuffixBatch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The drafter forward for ``bs'`` requests (all ``[bs']``-leading; ``seq_lens_cpu`` on the host):
        their blocks, with branching the baseline block's slot logits, with ``verify_threshold`` the
        drafts' probabilities (`_draft`)."""
        bs, block = prefix.shape[0], self.widths.block_size  # draft_slots, or the drafter's whole block
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        translator = self.target_worker.model_runner.kv_index_translator
        extra = self.widths.extra_rows
        win = draft_window(prefix, anchors, extra, block, int(self._mask_token_id),
                           max_prefix=int(seq_lens_cpu.max()), prefix_sum=int(seq_lens_cpu.sum()))
        queries = win.input_ids.shape[1]

        if extra:  # rejected-suffix features -> draft K/V at columns s .. s+X-1
            extra_loc = req_to_token[slots[:, None], win.extra_columns].long()
            extra_plan = translator.plan(req_pool_indices=slots, seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu,
                                         write_virtual=extra_loc.reshape(-1), read_extent=extra)
            self._append_target_hidden_to_draft_kv_by_loc(
                target_hidden=suffix.features.reshape(bs * extra, -1),
                cache_loc=self._draft_write_ids(extra_plan),
                positions=win.extra_positions.reshape(-1),
            )

        target_model = self.target_worker.model_runner.model
        embed = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
        lm_head = unwrap_lora_layer(getattr(target_model, "lm_head", None))
        ids = win.input_ids
        if self._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(ids, self._full_embed_gpu)
        else:
            noise = embed(ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale

        query_loc = req_to_token[slots[:, None], win.query_columns].long()
        draft_seq_lens_cpu = seq_lens_cpu + extra
        spec_info = DraftWindowInput(
            draft_token=torch.empty(0, dtype=torch.long, device=ids.device),
            positions=torch.empty(0, dtype=torch.long, device=ids.device),
            draft_token_num=queries, custom_mask=win.custom_mask, capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=ids.reshape(-1),
            req_pool_indices=slots,
            seq_lens=win.seq_lens,
            out_cache_loc=query_loc.reshape(-1),
            seq_lens_sum=int(draft_seq_lens_cpu.sum()),
            seq_lens_cpu=draft_seq_lens_cpu,
            positions=win.positions.reshape(-1),
            input_embeds=noise.reshape(bs * queries, -1),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * queries, dtype=torch.int32, device=ids.device)
                if enable_num_token_non_padded() else None
            ),
            global_num_token_non_padded_cpu=bs * queries,
            can_run_decode_cuda_graph=False,
        )
        draft_plan = translator.plan(req_pool_indices=slots, seq_lens=win.seq_lens, seq_lens_cpu=draft_seq_lens_cpu,
                                     write_virtual=query_loc.reshape(-1), read_extent=queries)
        draft_plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            out = self.draft_model_runner.forward(forward_batch)
            hidden = out.logits_output.hidden_states.view(bs, -1, block, out.logits_output.hidden_states.shape[-1])
            n = self._num_drafts  # the LM head skips the slots past max_depth
            block_anchors = ids.view(bs, -1, block)[:, :, 0]
            logits = probs = None
            vocab = int(self.target_worker.model_runner.model_config.vocab_size)
            if self._family_head is not None:  # the project's rollout (equal to SGLang's), scores and probabilities
                if self.reanchor.branch_width:
                    drafts, probs, logits = self._family_head.rollout_with_scores(
                        hidden, block_anchors, embed_tokens=embed, lm_head=lm_head, num_drafts=n, vocab_size=vocab,
                        with_probs=self._with_probs)
                else:
                    drafts, probs = self._family_head.rollout_with_probs(
                        hidden, block_anchors, embed_tokens=embed, lm_head=lm_head, num_drafts=n, vocab_size=vocab)
            elif self._is_domino:  # every block rolled out from its own anchor by SGLang's Domino rollout
                drafts = self._domino_drafts(hidden, block_anchors, embed, lm_head)[:, :, :n]
            elif self._is_dspark:  # ... by SGLang's DSpark Markov rollout
                drafts = self._dspark_drafts(hidden, block_anchors, embed, lm_head, n)
            elif self.reanchor.branch_width or self._with_probs:  # scores read on this rank (TP 1)
                drafts, probs, logits = self._scored_drafts(hidden[:, :, 1:1 + n], lm_head)
            else:
                drafts = self._greedy_drafts(hidden[:, :, 1:1 + n].reshape(-1, hidden.shape[-1]), lm_head)
                drafts = drafts.view(bs, -1, n)
        return torch.cat([ids.view(bs, -1, block)[:, :, :1], drafts], dim=2), logits, probs

    def _scored_drafts(self, slots: torch.Tensor, lm_head: Any,
                       chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """DFlash's drafts of ``slots`` (``[bs, R', n, H]``: each block's draft slots) from one LM-head pass,
        as the engine's `ArgmaxHead` scores them (over the draft vocabulary or the target's real one), with
        what the round reads besides: ``verify_threshold``'s probability of each draft (``[bs, R', n]``
        float32, else None) and branching's baseline logits (``[bs, n, V']``, else None). The baseline's
        rows go first, in one piece when branching keeps them; the rest ``chunk`` rows at a time, so that
        no more than ``chunk x V'`` other logits exist at once. ``--tp-size 1`` only (`_check_tp`)."""
        bs, rows, n, dim = slots.shape
        by_row = slots.transpose(0, 1).reshape(-1, dim)  # [R' * bs * n, H]: the baseline's rows first
        kept = bs * n if self.reanchor.branch_width else 0
        pieces = ([by_row[:kept]] if kept else []) + list(by_row[kept:].split(chunk))
        ids, probs, baseline = [], [], None
        for part in pieces:
            scores = self._draft_logits(part, lm_head)  # [m, V']
            if baseline is None and kept:
                baseline = scores.view(bs, n, -1)
            best = scores.argmax(-1)
            ids.append(best if self._draft_vocab_head is None else self._draft_vocab_head.token_ids[best])
            if self._with_probs:
                probs.append(chosen_prob(scores))
        drafts = torch.cat(ids).view(rows, bs, n).transpose(0, 1)
        prob = torch.cat(probs).view(rows, bs, n).transpose(0, 1) if self._with_probs else None
        return drafts, prob, baseline

    def _draft_logits(self, hidden: torch.Tensor, lm_head: Any) -> torch.Tensor:
        """The drafter's logits (``hidden [.., H]`` -> ``[.., V']``): over the draft vocabulary, or over the
        target's real vocabulary (an SGLang head pads its rows)."""
        if self._draft_vocab is not None:
            return self._draft_vocab_logits(hidden, lm_head)
        vocab = int(self.target_worker.model_runner.model_config.vocab_size)
        return torch.nn.functional.linear(hidden.to(lm_head.weight.dtype), lm_head.weight[:vocab])

    def _own_family_head(self) -> RolloutHead:
        """The project's `DominoHead` / `DSparkHead` over SGLang's loaded modules (shared, not copied):
        its rollout equals SGLang's (tests_sglang/test_drafter_families.py) and also returns the scores
        each draft was the argmax of (branching) and its probability (``verify_threshold``), which
        SGLang's rollouts do not return. Both run at ``--tp-size 1`` only (`_check_tp`), where no
        rollout needs a TP sync."""
        model = self.draft_model
        if self._is_domino:
            return DominoHead(model.prefix_gru, model.embed_proj, bool(model.shift_label),
                              candidate_pool_size=int(self.domino_candidate_pool_size))
        return DSparkHead.over(model.markov_head, getattr(model, "confidence_head", None),
                               bool(model.sample_from_anchor))

    def _domino_drafts(self, hidden: torch.Tensor, anchors: torch.Tensor, embed: Any, lm_head: Any) -> torch.Tensor:
        """Domino's drafts of every block (``hidden [bs, R, B, H]``, ``anchors [bs, R]``) -> ``[bs, R, B-1]``:
        SGLang's own `domino_greedy_rollout` (TP-safe), the ``R`` blocks of each request as rows."""
        from sglang.srt.speculative.domino_utils import domino_greedy_rollout

        bs, rows, block, dim = hidden.shape
        shard = getattr(lm_head, "shard_indices", None)
        drafts = domino_greedy_rollout(
            draft_hidden=hidden.reshape(bs * rows, block, dim), bonus_tokens=anchors.reshape(-1),
            target_embedding=embed, lm_head_weight=lm_head.weight, prefix_gru=self.draft_model.prefix_gru,
            embed_proj=self.draft_model.embed_proj, vocab_size=int(self.model_runner.model_config.vocab_size),
            shift_label=bool(self.draft_model.shift_label), candidate_pool_size=self.domino_candidate_pool_size,
            tp_group=get_parallel().tp_group,
            lm_head_org_vocab_start=int(shard.org_vocab_start_index) if shard is not None else 0,
            lm_head_num_org=int(shard.num_org_elements) if shard is not None else None,
            lm_head_num_org_padded=int(shard.num_org_elements_padded) if shard is not None else None,
            in_cuda_graph=False,
        )
        return drafts.view(bs, rows, block - 1)

    def _dspark_drafts(self, hidden: torch.Tensor, anchors: torch.Tensor, embed: Any, lm_head: Any,
                       n: int) -> torch.Tensor:
        """DSpark's first ``n`` drafts of every block (``hidden [bs, R, W, H]``, ``anchors [bs, R]``) ->
        ``[bs, R, n]``: base logits of the proposal slots by SGLang's ``compute_base_logits`` (the target's
        LM head, TP-gathered), the Markov head's greedy rollout by its ``draft_markov_block``, the ``R``
        blocks of each request as rows. The proposal slots start at the anchor's when the drafter
        samples from it, else one later; a rollout's first ``n`` drafts read only its first ``n`` slots."""
        from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise, draft_markov_block

        model = self.draft_model
        if model.lm_head is None:  # SGLang's DSPARK worker attaches the target's modules the same way
            model.attach_shared_modules(embed_tokens=embed, lm_head=lm_head)
        bs, rows, _, dim = hidden.shape
        start = 0 if model.sample_from_anchor else 1
        slots = hidden[:, :, start:start + n].reshape(bs * rows, n, dim)
        base, _ = model.compute_base_logits(slots.reshape(bs * rows * n, dim))
        drafts, _ = draft_markov_block(
            markov_head=model.markov_head, base_logits=base.view(bs * rows, n, -1), anchor_tokens=anchors.reshape(-1),
            draft_hidden=slots, step_temperatures=torch.zeros(bs * rows, device=hidden.device),
            noise=DraftNoise(key=0, offset=torch.zeros(1, dtype=torch.int64, device=hidden.device)),  # unused: greedy
            tp_sync=self._tp_sync, greedy_draft=True,
        )
        return drafts.view(bs, rows, n)

    def _greedy_drafts(self, hidden: torch.Tensor, lm_head: Any) -> torch.Tensor:
        """The argmax draft of each row of ``hidden`` (``[M, H]``): over the whole vocabulary (TP-safe,
        DFlash's), or over the configured draft vocabulary (``draft_vocab``). ``[M]`` long."""
        if self._draft_vocab is None:
            return self._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=lm_head)
        logits = self._draft_vocab_logits(hidden, lm_head)
        assert self._draft_vocab_head is not None
        return self._draft_vocab_head.token_ids[logits.argmax(-1)]

    def _draft_vocab_logits(self, hidden: torch.Tensor, lm_head: Any) -> torch.Tensor:
        """The draft-vocabulary head on ``hidden [.., H]`` -> ``[.., K]`` (built over ``lm_head`` at the first
        draft, when it exists): through oneDNN's packed kernel where this server packs its linears
        (`packed_linears`), as the LM head would run."""
        if self._draft_vocab_head is None:
            assert self._draft_vocab is not None
            self._draft_vocab_head = DraftVocabHead(lm_head, self._draft_vocab)
        head = self._draft_vocab_head
        x = hidden.to(head.weight.dtype)
        packed = packed_linear_or_none(head, head.weight, x, head.bias) if self._pack_linears else None
        return head(x) if packed is None else packed

    def _check_tp(self, server_args: Any) -> None:
        """What reads the whole LM head on one rank: refused at ``--tp-size`` > 1, naming the field."""
        if int(getattr(server_args, "tp_size", 1) or 1) == 1:
            return
        for field, value in (("branch_width", self.reanchor.branch_width), ("draft_vocab", self.reanchor.draft_vocab),
                             ("verify_threshold", self.reanchor.verify_threshold)):
            if value:
                raise ValueError(f"REANCHOR {field} needs --tp-size 1 (it reads the whole LM head, split across "
                                 f"ranks at TP > 1); set it to {0 if field == 'branch_width' else 'null'}")

    def _load_draft_vocab(self, server_args: Any) -> torch.Tensor | None:
        """``draft_vocab``: the ``K`` most frequent tokens of the drafter folder's ranking, or None."""
        k = self.reanchor.draft_vocab
        if k is None:
            return None
        return load_draft_vocab(server_args.speculative_draft_model_path, k).to(self.device)

    def _accept(self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor,
                sampling_info: Any) -> Acceptance:
        """Accept with the target's pick at every node: argmax, or a draw from its distribution.

        ``logits``: ``[bs, N, V]``, row ``i`` = the target after node ``i`` (adjusted);
        ``positions``: ``[bs, N]``.

        Both the picks and the top-1 predictions are the TP-synced ones: the
        predictions become the next round's shifted anchors, so a rank whose
        local argmax broke a near-tie differently would draft a different tree.
        """
        top1 = self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, logits.argmax(-1))  # [bs, N]
        if sampling_info is None or sampling_info.is_all_greedy:
            return self.core.accept(tree, top1, top1)
        picks = node_picks(logits, positions, sampling_info, self._sample_rng)
        picks = self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, picks)
        return self.core.accept(tree, picks, top1)


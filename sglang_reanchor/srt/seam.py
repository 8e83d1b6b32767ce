"""Every place REANCHOR reaches into SGLang's internals, in one table, checked at start-up.

SGLang has no stable API for a speculative-algorithm plugin beyond its registry, so
the plugin reaches into private code in two ways, both listed here and nowhere else:

- **hooks** (`HOOKS`): functions wrapped through SGLang's own ``HookRegistry`` (an
  AROUND hook receives the original and calls it, or not). Each row names its target,
  when it is installed, on which device it matters, why, and the SGLang version it was
  written against. The implementations live with the concept they serve (`cpu_compat`,
  `context_end`, `request_checks`); only this module registers them.
- **private API** (`PRIVATE_API`): ``DFlashWorkerV2`` methods and attributes that
  ``ReAnchorWorker`` (its subclass) calls: the draft runner's KV writers, the TP-safe
  argmax over the vocab-parallel head, the mask-token embedding.

`check_version` runs when the plugin loads: an SGLang version not in `TESTED_SGLANG`
is refused with a message naming the tested one (``SGLANG_REANCHOR_ALLOW_UNTESTED=1``
runs anyway, with a warning). `check_targets` runs when a REANCHOR worker starts:
every target above must resolve, so a renamed private attribute fails at start-up
with its name, not mid-request with an ``AttributeError``.

Nothing here imports SGLang at module level.
"""

from __future__ import annotations

import logging
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ALLOW_UNTESTED_ENV", "HOOKS", "PRIVATE_API", "TESTED_SGLANG", "Hook", "check_targets", "check_version",
           "install"]

logger = logging.getLogger(__name__)

TESTED_SGLANG = ("0.5.23",)
ALLOW_UNTESTED_ENV = "SGLANG_REANCHOR_ALLOW_UNTESTED"

When = Literal["load", "worker"]


@dataclass(frozen=True)
class Hook:
    """One AROUND hook on an SGLang function."""

    name: str  # short name, for logs
    target: str  # dotted path of the patched function or method
    impl: str  # "module:function" of the wrapper, relative to sglang_reanchor.srt
    when: When  # "load": in every SGLang process when the plugin loads; "worker": in REANCHOR schedulers
    device: str  # where it changes anything
    reason: str
    plain_cpu_only: bool = False  # installed only where SGLang sees no accelerator platform
    opt_in: str | None = None  # installed only where this environment variable is 1 (`packed_linears`)
    sglang: str = "0.5.23"  # the version it was written against


HOOKS: tuple[Hook, ...] = (
    Hook("rope-init", "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__",
         "cpu_compat:_rope_init_without_vllm", "load", "plain CPU",
         "the constructor imports vllm's rotary kernel on an unknown device; take the CPU branch",
         plain_cpu_only=True),
    Hook("packed-linear", "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
         "packed_linears:_packed_apply", "load", "plain CPU, float32",
         "float32 F.linear on a few rows is slow on AVX2 CPUs: oneDNN weights packed once (every server)",
         plain_cpu_only=True, opt_in="SGLANG_REANCHOR_PACK_LINEARS"),
    Hook("packed-lm-head", "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
         "packed_linears:_packed_lm_head", "load", "plain CPU, float32",
         "the LM head's float32 matmul on a few rows, as packed-linear (every server)",
         plain_cpu_only=True, opt_in="SGLANG_REANCHOR_PACK_LINEARS"),
    Hook("validate-request", "sglang.srt.managers.scheduler.validate_dflash_request",
         "request_checks:_validate", "load", "any",
         "refuse on arrival what a tree cannot serve (custom logit processors), in REANCHOR schedulers only"),
    Hook("validate-sampling-mask", "sglang.srt.managers.scheduler.validate_spec_sampling_mask_request",
         "request_checks:_validate_sampling_mask", "load", "any",
         "REANCHOR draws every node from the target's own support: admit return_sampling_mask at T > 0"),
    Hook("embeds-dtype", "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs",
         "cpu_compat:_embeds_in_model_dtype", "worker", "any",
         "input_embeds are cast to bfloat16 whatever the model dtype; a float32 drafter needs its own"),
    Hook("triton-prefix-mask", "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
         "cpu_compat:_extend_with_prefix_mask", "worker", "any (Triton backend)",
         "the draft window's mask must also cover the prefix (rejected-suffix rows) for masks_prefix inputs"),
    Hook("reservation-row-end", "sglang.srt.mem_cache.allocation_sizing.page_aligned_decode_alloc_lens",
         "context_end:_alloc_lens_within_row", "worker", "any",
         "SGLang's decode reservation may run past a req_to_token row's end; cap it there"),
    Hook("qk-norm-rope", "sglang.kernels.ops.attention.table_qk_norm_rope.table_qk_norm_rope_",
         "cpu_compat:_table_qk_norm_rope_torch", "worker", "plain CPU",
         "the drafter's fused QK-norm + RoPE is a Triton kernel: minutes per forward in the interpreter",
         plain_cpu_only=True),
    Hook("assign-req-to-token", "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func",
         "cpu_compat:_assign_req_to_token_torch", "worker", "plain CPU",
         "a speculative step's reservation writes req_to_token with a Triton kernel: the interpreter on a CPU",
         plain_cpu_only=True),
    Hook("all-gather-cpu", "sglang.srt.distributed.parallel_state.GroupCoordinator.all_gather_into_tensor",
         "cpu_compat:_all_gather_on_cpu", "worker", "plain CPU, TP > 1",
         "the custom all-gather op has no CPU kernel; use SGLang's gloo path as its CPU engine does",
         plain_cpu_only=True),
    Hook("domino-on-cpu", "sglang.srt.speculative.dflash_worker_v2.validate_domino_runtime",
         "cpu_compat:_validate_domino_on_cpu", "worker", "plain CPU",
         "SGLang's Domino runtime wants CUDA and bfloat16; its rollout is plain torch: keep the other checks",
         plain_cpu_only=True),
)

# What ReAnchorWorker uses of DFlashWorkerV2 beyond its public entry points.
PRIVATE_API: tuple[str, ...] = tuple(
    "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2." + name for name in (
        "_append_target_hidden_to_draft_kv_by_loc", "_greedy_sample_from_vocab_parallel_head",
        "_draft_write_ids", "_make_next_draft_input_decode",
    )
) + (
    "sglang.srt.speculative.dflash_worker_v2._resolve_dflash_embedding_module",
    "sglang.srt.speculative.draft_worker_common.build_block_pos_offsets",
    "sglang.srt.speculative.draft_worker_common.make_draft_block_spec_info",
    "sglang.srt.speculative.spec_utils.build_grammar_vocab_mask",
    "sglang.srt.layers.logprob_processor.compute_spec_logprobs",
    "sglang.srt.mem_cache.memory_pool.move_kv_cache_native",
    "sglang.srt.speculative.domino_utils.domino_greedy_rollout",
    "sglang.srt.runtime_context.get_parallel",
)


def resolve(target: str) -> Any:
    """The object at a dotted path (a class attribute through the class ``__dict__``)."""
    owner, name = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(owner)
    return obj.__dict__[name] if isinstance(obj, type) and name in obj.__dict__ else getattr(obj, name)


def check_version(version: str | None = None, environ: dict[str, str] | None = None) -> None:
    """Refuse an SGLang not in `TESTED_SGLANG` (unless ``$SGLANG_REANCHOR_ALLOW_UNTESTED`` is 1).

    >>> check_version("0.5.23")
    >>> check_version("0.6.0", environ={})
    Traceback (most recent call last):
    ...
    RuntimeError: sglang-reanchor was written and tested against SGLang 0.5.23, this is SGLang 0.6.0; REANCHOR reaches into private SGLang code (sglang_reanchor/srt/seam.py lists where). Install sglang==0.5.23, or set SGLANG_REANCHOR_ALLOW_UNTESTED=1 to try anyway
    """
    if version is None:
        import sglang

        version = sglang.__version__
    env = os.environ if environ is None else environ
    if version not in TESTED_SGLANG:
        message = (f"sglang-reanchor was written and tested against SGLang {', '.join(TESTED_SGLANG)}, "
                   f"this is SGLang {version}; REANCHOR reaches into private SGLang code "
                   f"(sglang_reanchor/srt/seam.py lists where). Install sglang=={TESTED_SGLANG[-1]}, or set "
                   f"{ALLOW_UNTESTED_ENV}=1 to try anyway")
        if env.get(ALLOW_UNTESTED_ENV, "") != "1":
            raise RuntimeError(message)
        logger.warning("REANCHOR: %s", message)


def check_targets() -> None:
    """Fail now, naming them, if hook targets or private attributes are missing from this SGLang."""
    missing = []
    for target in [h.target for h in HOOKS] + list(PRIVATE_API):
        try:
            resolve(target)
        except (ImportError, AttributeError, KeyError, ValueError):
            missing.append(target)
    if missing:
        raise RuntimeError(f"REANCHOR: this SGLang lacks what the plugin hooks or calls: {', '.join(missing)}")


_installed: set[When] = set()


def install(when: When, plain_cpu: bool) -> list[str]:
    """Register the hooks of one group (``"load"``: from the plugin entry point; ``"worker"``: from
    ``ReAnchorWorker.__init__``, before its model runners exist) and patch them in.

    ``plain_cpu``: SGLang sees no accelerator platform (`cpu_compat.needs_cpu_hooks`).
    Returns the names installed; a second call for the same group does nothing. A target
    another plugin patched first fails loudly (SGLang's ``HookRegistry`` patches a target once).
    """
    if when in _installed:
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = [h for h in HOOKS if h.when == when and (plain_cpu or not h.plain_cpu_only) and _opted_in(h)]
    for hook in hooks:
        HookRegistry.register(hook.target, _impl(hook), HookType.AROUND)
    if when == "worker":  # load-time hooks are applied by SGLang's own load_plugins()
        _apply_or_fail([h.target for h in hooks])
    _installed.add(when)
    if any(h.opt_in for h in hooks):  # changes every server of this SGLang, plain ones included: say so
        logger.warning("REANCHOR: float32 CPU linears run on oneDNN weights packed once, in every server "
                       "($SGLANG_REANCHOR_PACK_LINEARS=1; sglang_reanchor/srt/packed_linears.py)")
    logger.info("REANCHOR: %s hooks: %s", when, ", ".join(h.name for h in hooks) or "none")
    return [h.name for h in hooks]


def _opted_in(hook: Hook) -> bool:
    if hook.opt_in is None:
        return True
    from .packed_linears import PACK_LINEARS_ENV, packing_requested

    assert hook.opt_in == PACK_LINEARS_ENV, hook.opt_in  # the only opt-in so far
    return packing_requested()


def _impl(hook: Hook) -> Callable[..., Any]:
    import importlib

    module, name = hook.impl.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _apply_or_fail(targets: list[str]) -> None:
    """``HookRegistry.apply_hooks()``, and a clear error for a target it left unpatched."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = {t: resolve(t) for t in targets}
    HookRegistry.apply_hooks()
    stale = [t for t in targets if resolve(t) is before[t]]
    if stale:
        raise RuntimeError(f"REANCHOR: could not hook {', '.join(stale)}: already patched by another plugin "
                           f"(SGLang's HookRegistry patches a target once)")

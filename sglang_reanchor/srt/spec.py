"""``REANCHOR`` as an SGLang speculative algorithm: capabilities and server arguments.

Imported only by `sglang_reanchor.srt.plugin.register` (it imports SGLang).

`ReAnchorSpecAlgo` claims the DFlash capabilities (``is_dflash``,
``is_dflash_family``, ``supports_target_verify_for_draft``), so SGLang sets up for
it exactly what it sets up for ``DFLASH``: the target's aux hidden-state capture at
the drafter's ``target_layer_ids``, the draft model runner and its KV pool sharing
the target's slot indices, and the slot reservation of
``DFlashDraftInputV2.prepare_for_decode``. It defines the methods the scheduler
calls that SGLang's ``CustomSpecAlgo`` lacks (``create_future_map``,
``carries_draft_hidden_states``, ``need_topk``, ``get_platform_worker_cls``).

`handle_server_args` makes ``--speculative-algorithm REANCHOR
--speculative-draft-model-path D`` enough: it sets what the worker needs and
rejects what it cannot serve, with a message naming the flag.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .packed_linears import packs_linears_here
from .settings import COST_PROFILE_ENV, ENV_VAR, config_json, load_config, served_config, serving_widths

__all__ = ["NAME", "ReAnchorSpecAlgo", "draft_query_width", "handle_server_args", "is_dspark_config", "validate_server_args"]

logger = logging.getLogger(__name__)

NAME = "REANCHOR"
DEFAULT_MAX_RUNNING_REQUESTS = 48  # as DFLASH
# Backends whose TARGET_VERIFY path applies ``spec_info.custom_mask`` (FULL_MASK layout).
MASKED_BACKENDS = ("flashinfer", "triton", "reanchor_sdpa")  # reanchor_sdpa: cpu_attention


class ReAnchorSpecAlgo(CustomSpecAlgo):
    """The registered ``REANCHOR`` algorithm (duck-types ``SpeculativeAlgorithm``)."""

    # -- capabilities: the DFlash family ------------------------------------------
    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def supports_prefill_shared_read_done(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return True

    # -- what the scheduler calls that CustomSpecAlgo does not define -------------
    def carries_draft_hidden_states(self) -> bool:
        return False  # no disaggregated prefill->decode transfer of draft states

    def need_topk(self) -> bool:
        return False

    def get_platform_worker_cls(self) -> type | None:
        return None  # the project's worker on every platform

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    # -- server arguments ---------------------------------------------------------
    def handle_server_args(self, server_args: Any) -> None:
        handle_server_args(server_args)


def validate_server_args(server_args: Any) -> None:
    """Reject what ReAnchor cannot serve (runs before `handle_server_args`)."""
    cfg = resolving_view(server_args)
    problems = []
    if cfg.speculative_draft_model_path is None:
        problems.append("--speculative-draft-model-path is required (a DFlash drafter folder)")
    device = str(cfg.device or "cuda")
    if not (device.startswith("cuda") or device == "cpu"):
        problems.append(f"--device {device!r} is not supported (cuda, or cpu for testing)")
    if int(cfg.pp_size or 1) != 1:
        problems.append("--pp-size must be 1")
    if getattr(cfg, "enable_dp_attention", False):
        problems.append("--enable-dp-attention is not supported")
    if int(getattr(cfg, "page_size", None) or 1) != 1:
        problems.append("--page-size must be 1 (accepted tree nodes are moved slot by slot)")
    if getattr(cfg, "speculative_draft_window_size", None) is not None:
        problems.append("--speculative-draft-window-size is not supported")
    if getattr(cfg, "speculative_adaptive", False):
        problems.append("--speculative-adaptive is not supported")
    if getattr(cfg, "enable_mixed_chunk", False):
        problems.append("--enable-mixed-chunk is not supported")
    if getattr(cfg, "disaggregation_mode", "null") not in (None, "null"):
        problems.append("--disaggregation-mode is not supported")
    if os.environ.get("SGLANG_ENABLE_SPLITKV_VERIFY", "").lower() in ("1", "true", "yes"):
        problems.append("SGLANG_ENABLE_SPLITKV_VERIFY ignores custom verify masks; unset it")
    if problems:
        raise ValueError("REANCHOR: " + "; ".join(problems))
    load_config()  # a bad SGLANG_REANCHOR_CONFIG fails at launch, naming the field


def _folder_config(path: str | None) -> dict[str, Any]:
    """A local folder's config.json (empty for a hub id or an unreadable file)."""
    import json
    from pathlib import Path

    config = Path(path) / "config.json" if path else None
    if config is None or not config.is_file():
        return {}
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _is_domino_folder(path: str | None) -> bool:
    dflash = _folder_config(path).get("dflash_config") or {}
    return isinstance(dflash, dict) and dflash.get("projector_type") == "domino"


def _has_own_rollout(path: str | None) -> bool:
    """Whether a local drafter folder's head rolls its drafts out slot after slot over the whole
    vocabulary (Domino, DSpark): such servers run no ``draft_vocab``."""
    return _is_domino_folder(path) or (path is not None and _is_dspark_folder(path))


def _target_dtype(cfg: Any) -> str:
    """The target's dtype as SGLang will run it: ``--dtype``, or for ``auto`` the model's config."""
    names = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
             "bfloat16": "bfloat16"}
    value = str(cfg.dtype or "auto")
    if value == "auto":
        raw = _folder_config(cfg.model_path)
        value = str(raw.get("torch_dtype") or raw.get("dtype") or "auto")
    return names.get(value, value)


def _is_dspark_folder(path: str) -> bool:
    """Whether a local drafter folder holds a DSpark checkpoint (``Qwen3DSparkModel``); a hub id is left
    to SGLang's loader."""
    return any("DSpark" in str(a) for a in _folder_config(path).get("architectures") or [])


def handle_server_args(server_args: Any) -> None:
    """Set the arguments the ReAnchor worker needs (plain writes, recorded by SGLang).

    - overlap scheduling off (the worker is synchronous), CUDA graphs off (verify
      uses a per-step tree mask that SGLang's graph capture does not provide);
    - ``speculative_num_steps = 1``, ``speculative_eagle_topk = 1`` (as DFLASH);
    - ``speculative_num_draft_tokens`` = the per-step reservation that covers the
      multi-anchor draft window and the tree (`serving_widths`);
    - the draft attention backend: the target's, else flashinfer on CUDA and
      ``reanchor_sdpa`` (`cpu_attention`) elsewhere; ``max_running_requests`` 48 unless set;
    - ``$SGLANG_REANCHOR_CONFIG``, when unset, to the defaults for the device (`settings.served_config`).
    """
    validate_server_args(server_args)
    cfg = resolving_view(server_args)
    served = served_config(str(cfg.device or "cuda"), _target_dtype(cfg), cfg.speculative_draft_model_path,
                           tp_size=int(cfg.tp_size or 1), full_vocab_only=_has_own_rollout(cfg.speculative_draft_model_path),
                           packed_linears=packs_linears_here())
    config = served.config
    if served.source == "shipped":  # the schedulers this process spawns read the same config (settings.py)
        os.environ[ENV_VAR] = config_json(config)
        if served.cost_profile is not None:  # ... and budget their batches with the shipped profile
            os.environ[COST_PROFILE_ENV] = served.cost_profile
    log = logger.warning if served.source == "paper-cpu" else logger.info
    log("REANCHOR settings: %s: %s", served.note, config)
    block = _draft_block_size(cfg)
    widths = serving_widths(config, block)

    if not cfg.disable_overlap_schedule:
        server_args.disable_overlap_schedule = True
    if not cfg.disable_cuda_graph:
        server_args.disable_cuda_graph = True
    for name in ("speculative_num_steps", "speculative_eagle_topk"):
        value = getattr(cfg, name)
        if value is not None and int(value) != 1:
            logger.warning("REANCHOR uses %s = 1; overriding %s", name, value)
        setattr(server_args, name, 1)
    requested = cfg.speculative_num_draft_tokens
    if requested is not None and int(requested) < widths.reserve_width:
        raise ValueError(
            f"REANCHOR: --speculative-num-draft-tokens {requested} is below the {widths.reserve_width} "
            f"this config needs (node_budget {widths.verify_nodes}; {widths.extra_rows} + {widths.draft_queries} "
            f"draft tokens); leave it unset, or lower node_budget, offsets or draft_slots in ${ENV_VAR}"
        )
    if requested is None:
        server_args.speculative_num_draft_tokens = widths.reserve_width
    on_cuda = str(cfg.device or "cuda").startswith("cuda")
    target_backend = _user_value(server_args, "attention_backend")
    if target_backend is None:
        # SGLang's CPU default (torch_native) ignores custom masks; reanchor_sdpa is it plus them (cpu_attention).
        target_backend = cfg.attention_backend if on_cuda and cfg.attention_backend else None
        target_backend = target_backend or ("flashinfer" if on_cuda else "reanchor_sdpa")
        server_args.attention_backend = target_backend
    draft_backend = _user_value(server_args, "speculative_draft_attention_backend") or target_backend
    server_args.speculative_draft_attention_backend = draft_backend
    for flag, backend in (("--attention-backend", target_backend),
                          ("--speculative-draft-attention-backend", draft_backend)):
        if backend not in MASKED_BACKENDS:
            raise ValueError(
                f"REANCHOR: {flag} {backend} does not apply a custom tree mask; use one of "
                f"{', '.join(MASKED_BACKENDS)} (on CPU: reanchor_sdpa, or triton under TRITON_INTERPRET=1)"
            )
    if cfg.max_running_requests is None:
        server_args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS


def _user_value(server_args: Any, name: str) -> Any:
    """What the user passed for ``name`` (None when unset), ignoring values SGLang resolved.

    SGLang's resolution never writes the record's fields (it declares overrides),
    so the record's own attribute is the user's input.
    """
    record = server_args
    if type(record).__name__ == "_ForeignDefaults":  # the recorder handle_server_args gets
        record = object.__getattribute__(record, "_cfg")
    if type(record).__name__ == "ResolvingConfig":
        record = object.__getattribute__(record, "_server_args")
    return getattr(record, name, None)


def _draft_block_size(cfg: Any) -> int:
    """Query slots per draft block of the drafter ``cfg`` points at (`draft_query_width`)."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    hf_config = get_config(
        cfg.speculative_draft_model_path,
        trust_remote_code=bool(cfg.trust_remote_code),
        revision=getattr(cfg, "speculative_draft_model_revision", None),
    )
    return draft_query_width(hf_config)


def is_dspark_config(hf_config: Any) -> bool:
    """Whether a drafter's Hugging Face config names one of SGLang's DSpark draft classes."""
    return any("DSpark" in str(a) for a in getattr(hf_config, "architectures", None) or [])


def draft_query_width(hf_config: Any) -> int:
    """Query slots of one draft block ``[anchor, MASK x (W-1)]``: the config's block size (16 when it
    does not say); for a DSpark drafter its ``gamma``, plus one when it does not sample from the
    anchor's slot (SGLang's ``query_token_num``). The launcher reserves for it, the worker drafts it."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    block = int(parse_dflash_draft_config(draft_hf_config=hf_config).resolve_block_size(default=16))
    if not is_dspark_config(hf_config):
        return block
    from sglang.srt.speculative.dspark_components.dspark_config import (
        get_dspark_sample_from_anchor,
        parse_dspark_draft_config,
    )

    gamma = int(parse_dspark_draft_config(draft_hf_config=hf_config).resolve_gamma(default=block))
    return gamma + (0 if get_dspark_sample_from_anchor(hf_config) else 1)

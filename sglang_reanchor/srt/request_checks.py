"""Requests REANCHOR cannot serve are refused on arrival, with a message.

The REANCHOR worker scores each node of a draft tree with the penalties and the
grammar state of its own path (`node_sampling`, `ReAnchorWorker._mask_by_grammar`).
A custom logit processor, a function of one request's history, cannot be given one
history per node, so such a request is refused. If admitted, it would reach the
worker inside a running batch, where the only way out is an exception that stops
the scheduler and every other request with it. SGLang already checks each
DFlash-family request as it arrives (``validate_dflash_request`` in the scheduler,
SGLang 0.5.23); this hook adds REANCHOR's rule there, so the scheduler finishes the
request at once with ``finish_reason = {"type": "abort", "message": ...}`` and keeps
serving the rest.

``return_sampling_mask`` is the other way round: SGLang refuses it for non-greedy
DFlash-family requests unless its CUDA sampling-verify kernel is present
(``validate_spec_sampling_mask_request``), because DFlash then verifies sampled
rows by argmax. REANCHOR draws every node from the target's own filtered
distribution in torch (`node_sampling.node_picks`) and returns that support
(`node_sampling.emitted_support`), so the hook admits those requests.

The hooks (registered by `seam`) are installed in every SGLang process (plugins load everywhere) but only
refuses anything in a process whose scheduler built a `ReAnchorWorker`
(`mark_active`); DFLASH servers are untouched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["mark_active", "unsupported_reason"]

_active = False


def mark_active() -> None:
    """Called by `ReAnchorWorker.__init__`: this process serves REANCHOR."""
    global _active
    _active = True


def unsupported_reason(req: Any) -> str | None:
    """Why ``req`` (an SGLang ``Req``) cannot be served by REANCHOR, or None."""
    if getattr(req, "custom_logit_processor", None) is not None:
        return ("REANCHOR does not support custom_logit_processor: it sees one history per request, "
                "a draft tree needs one per node; send the request without it")
    return None


def _validate(original: Any, req: Any, *args: Any, **kwargs: Any) -> str | None:
    if _active and (reason := unsupported_reason(req)) is not None:
        # the scheduler still prefills an aborted request to answer it: none of its code runs
        req.custom_logit_processor = None
        return reason
    return original(req, *args, **kwargs)


def _validate_sampling_mask(original: Any, req: Any, *args: Any, **kwargs: Any) -> str | None:
    if _active:  # every support is the target's own: nothing to refuse (top_k is checked before)
        return None
    return original(req, *args, **kwargs)

"""Requests REANCHOR cannot serve yet are refused on arrival, with a message.

The REANCHOR worker verifies a tree with its own acceptance (`sglang_reanchor.verify`),
which has no grammar mask and returns no logprobs, and scores each node with the
penalties of its own path (`node_sampling`), which a custom logit processor (a
function of one request's history) cannot be given. Such a request, if admitted, would
reach the worker inside a running batch, where the only way out is an exception that
stops the scheduler and every other request with it. SGLang already checks each
DFlash-family request as it arrives (``validate_dflash_request`` in the scheduler,
SGLang 0.5.23); this hook adds REANCHOR's rules there, so the scheduler finishes the
request at once with ``finish_reason = {"type": "abort", "message": ...}`` and keeps
serving the rest.

The hook is installed in every SGLang process (plugins load everywhere) but only
refuses anything in a process whose scheduler built a `ReAnchorWorker`
(`mark_active`); DFLASH servers are untouched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GRAMMAR_FIELDS", "mark_active", "register_request_hooks", "unsupported_reason"]

VALIDATE = "sglang.srt.managers.scheduler.validate_dflash_request"
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")  # SamplingParams constraints

_active = False


def mark_active() -> None:
    """Called by `ReAnchorWorker.__init__`: this process serves REANCHOR."""
    global _active
    _active = True


def unsupported_reason(req: Any) -> str | None:
    """Why ``req`` (an SGLang ``Req``) cannot be served by REANCHOR, or None."""
    if getattr(req, "return_logprob", False):
        return ("REANCHOR does not support return_logprob yet; send the request without it, "
                "or serve it without speculative decoding")
    if getattr(req, "custom_logit_processor", None) is not None:
        return ("REANCHOR does not support custom_logit_processor: it sees one history per request, "
                "a draft tree needs one per node; send the request without it")
    params = getattr(req, "sampling_params", None)
    for field in GRAMMAR_FIELDS:
        if getattr(params, field, None) is not None:
            return (f"REANCHOR does not support grammar-constrained decoding yet "
                    f"(sampling_params.{field} is set); allowed: none of {', '.join(GRAMMAR_FIELDS)}")
    return None


def _validate(original: Any, req: Any, *args: Any, **kwargs: Any) -> str | None:
    if _active and (reason := unsupported_reason(req)) is not None:
        # the scheduler still prefills an aborted request to answer it: none of its code runs
        req.custom_logit_processor = None
        return reason
    return original(req, *args, **kwargs)


def register_request_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE, _validate, HookType.AROUND)

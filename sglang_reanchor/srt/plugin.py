"""The SGLang plugin entry point: registers ``REANCHOR`` as a speculative algorithm.

pyproject.toml declares::

    [project.entry-points."sglang.srt.plugins"]
    reanchor = "sglang_reanchor.srt.plugin:register"

SGLang's ``load_plugins()`` runs every entry point of that group in each of its
processes (the launcher, the tokenizer manager, every scheduler), so after
``pip install sglang-reanchor`` the command line
``python -m sglang.launch_server --speculative-algorithm REANCHOR
--speculative-draft-model-path D --model-path T`` works with no edit to SGLang.

This module imports SGLang only inside `register`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "worker_factory"]


def worker_factory(server_args: Any) -> type:
    """SGLang asks this for the worker class (imported only when a server starts)."""
    del server_args
    from .worker import ReAnchorWorker

    return ReAnchorWorker


def register() -> None:
    """Register ``REANCHOR`` with ``SpeculativeAlgorithm.register``; a no-op if it already is."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from . import cpu_attention
    from .cpu_compat import register_cpu_hooks
    from .request_checks import register_request_hooks
    from .spec import NAME, ReAnchorSpecAlgo, validate_server_args

    if get_spec(NAME) is not None:
        return
    register_cpu_hooks()  # plain-CPU serving only; see cpu_compat
    cpu_attention.register()  # a new --attention-backend choice, reanchor_sdpa (custom masks on CPU)
    # The dtype and Triton mask hooks are installed by ReAnchorWorker (REANCHOR processes only).
    register_request_hooks()  # custom logit processors refused on arrival; see request_checks
    SpeculativeAlgorithm.register(
        NAME,
        supports_overlap=False,
        validate_server_args=validate_server_args,
        spec_class=ReAnchorSpecAlgo,
    )(worker_factory)

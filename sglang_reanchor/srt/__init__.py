"""SGLang integration: ``--speculative-algorithm REANCHOR`` (see docs/sglang.md).

- `settings`: the `ReAnchorConfig` of a server (``$SGLANG_REANCHOR_CONFIG``) and the
  token widths SGLang reserves for it (no SGLang import).
- `layout`: one step's tensors in SGLang's layouts: the multi-anchor draft window,
  the tree verify inputs (FULL_MASK, positions, ``retrieve_*``), the accepted
  path's KV moves and commit layout (pure torch, no SGLang import).
- `draft_kv_backlog`: root-alone rounds' draft-KV rows, held while their batch decodes
  plainly and written in one call before anything reads the draft KV (pure torch).
- `context_end`: what a round may write near the end of a request's ``req_to_token``
  row, the check that SGLang reserved it, and the cap on SGLang's reservation there.
- `plugin`: the ``sglang.srt.plugins`` entry point; `spec`: the algorithm's
  capabilities and server arguments; `worker`: ``ReAnchorWorker`` (these import
  SGLang and are loaded by it).
"""

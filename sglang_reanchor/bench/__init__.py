"""Benchmark suite: ``python -m sglang_reanchor.bench`` (see `__main__` for the CLI).

Modules: `datasets` (prompts), `methods` (``--methods`` specs and ablations),
`runner` (interleaved runs), `metrics` (tau, tokens/s, speedup), `analysis`
(the paper's Tables 1, 5, 8 and Figure 2 from traced rounds), `cost` (cost model
and defaults), `report` (markdown, JSON, PNG).
"""

from .datasets import Sample, load_dataset, read_prompts
from .methods import MethodSpec, parse_methods
from .metrics import Record, summarize

__all__ = ["MethodSpec", "Record", "Sample", "load_dataset", "parse_methods", "read_prompts", "summarize"]

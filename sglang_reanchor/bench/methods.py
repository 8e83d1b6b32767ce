"""Method specs for ``--methods``: an engine method plus `ReAnchorConfig` changes.

A spec is ``METHOD[:KEY=VALUE,KEY=VALUE...]`` with ``METHOD`` one of ``target``,
``dflash``, ``reanchor``; keys are `ReAnchorConfig` fields; ``offsets`` takes
``/``-separated ints (``reanchor:offsets=1/2,node_budget=32``);
``node_budget=auto`` picks each round's budget at run time from a measured cost
model (`sglang_reanchor.budget`; needs ``--profile``); ``dtype=float32`` (or
``bfloat16``) runs that method's target and drafter in another precision than the
run's ``--dtype`` (any method; e.g. ``target:dtype=bfloat16`` measures plain decoding
in both); ``draft_vocab=K`` drafts over the drafter's ``K`` most frequent target tokens
(its folder's ``draft_vocab.safetensors``; `sglang_reanchor.drafter.draft_vocab`);
``max_depth=n`` verifies drafts down to depth ``n`` only, ``draft_slots=W`` drafts
blocks of ``W`` query slots and ``verify_threshold=p`` cuts each row where the drafter's
confidence runs out (all three for ``dflash`` and ``reanchor``); ``drafter=NAME`` drafts
with a drafter named by ``--extra-drafter NAME=DIR`` instead of ``--drafter`` (so several
drafters compare in one run); ``gate=1`` runs it with a `SpeculationGate` (plain decode
steps while a request's rounds lose to plain decoding, as `from_pretrained` sets on a CPU;
``dflash`` and ``reanchor``); ``packed=1`` runs it on copies of target and drafter whose
float32 CPU linears are packed once for oneDNN (`sglang_reanchor.engine.packed_linear`; any
method, e.g. ``target:packed=1`` beside ``target``; its precision reads ``float32-packed`` in
the identity tables). The spec string is the method's label in every table. `ABLATIONS` are the
paper's Tables 4, 6 and 7.

>>> spec = MethodSpec.parse("reanchor:policy=offset,offsets=1/2")
>>> spec.method, spec.changes
('reanchor', {'policy': 'offset', 'offsets': (1, 2)})
>>> spec.config(ReAnchorConfig()).offsets
(1, 2)
>>> MethodSpec.parse("reanchor:node_budget=auto").auto_budget
True
>>> MethodSpec.parse("target:dtype=bfloat16").dtype
'bfloat16'
>>> MethodSpec.parse("dflash:draft_vocab=8192").draft_vocab
8192
>>> MethodSpec.parse("reanchor:offsets=,branch_width=2,branch_temperature=1.5").config(ReAnchorConfig()).branch_width
2
>>> MethodSpec.parse("dflash:drafter=dspark,max_depth=3").drafter
'dspark'
>>> MethodSpec.parse("reanchor:gate=1").gate
True
>>> MethodSpec.parse("target:packed=1").packed
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..config import ReAnchorConfig
from ..engine import METHODS

__all__ = ["ABLATIONS", "DTYPES", "MAIN_METHODS", "MethodSpec", "parse_methods"]

MAIN_METHODS: tuple[str, ...] = ("target", "dflash", "reanchor")
ABLATIONS: dict[str, tuple[str, ...]] = {
    "table4_region": ("reanchor:region=in_block", "reanchor:region=beyond"),
    "table6_attachment": ("reanchor:policy=offset", "reanchor:policy=random", "reanchor:policy=longest_prefix"),
    "table7_fixed_offset": ("reanchor:policy=offset",),
}
_INT_FIELDS = {"node_budget", "max_requests", "seed", "max_depth", "draft_slots", "batch_node_budget",
               "disable_by_batch_size", "branch_width", "branch_rows", "branch_length"}
_FLOAT_FIELDS = {"branch_temperature", "verify_threshold"}
_CHAIN_FIELDS = {"max_depth", "draft_slots", "verify_threshold"}  # settings that apply to DFlash's chain too
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
_BOOL_FIELDS = {"root_site"}


@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method: ``label`` (the spec text), engine ``method``, config ``changes``."""

    label: str
    method: str
    changes: dict[str, object] = field(default_factory=dict)
    auto_budget: bool = False  # node_budget=auto: chosen per round from a cost profile
    dtype: str | None = None  # precision of this method's models (None: the run's --dtype)
    draft_vocab: int | None = None  # draft over the drafter's K most frequent tokens (None: all)
    drafter: str | None = None  # an --extra-drafter's name (None: the run's --drafter)
    gate: bool = False  # gate=1: a SpeculationGate (plain steps while speculation does not pay)
    packed: bool = False  # packed=1: float32 CPU linears packed once for oneDNN

    @staticmethod
    def parse(text: str) -> MethodSpec:
        text = text.strip()
        method, _, rest = text.partition(":")
        if method not in METHODS:
            raise ValueError(f"method spec {text!r}: method must be one of {', '.join(METHODS)}")
        allowed = {f.name for f in fields(ReAnchorConfig)}
        changes: dict[str, object] = {}
        auto, dtype, vocab, drafter, gate, packed = False, None, None, None, False, False
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if key == "dtype" and eq:
                if value not in DTYPES:
                    raise ValueError(f"method spec {text!r}: dtype must be one of {', '.join(DTYPES)}")
                dtype = value
                continue
            if key == "drafter" and eq:
                if method == "target" or not value:
                    raise ValueError(f"method spec {text!r}: drafter takes an --extra-drafter name (dflash, reanchor)")
                drafter = value
                continue
            if key == "gate" and eq:
                if method == "target" or value not in ("0", "1"):
                    raise ValueError(f"method spec {text!r}: gate takes 0 or 1 (dflash, reanchor)")
                gate = value == "1"
                continue
            if key == "packed" and eq:
                if value not in ("0", "1"):
                    raise ValueError(f"method spec {text!r}: packed takes 0 or 1")
                packed = value == "1"
                continue
            if key == "draft_vocab" and eq:
                if method == "target" or not value.isdigit() or int(value) < 1:
                    raise ValueError(f"method spec {text!r}: draft_vocab takes an int >= 1 (dflash, reanchor)")
                vocab = int(value)
                continue
            if not eq or key not in allowed:
                raise ValueError(f"method spec {text!r}: expected KEY=VALUE with KEY in {', '.join(sorted(allowed))}")
            if key == "node_budget" and value == "auto":
                auto = True
                continue
            changes[key] = _convert(key, value)
        if (auto or set(changes) - _CHAIN_FIELDS) and method != "reanchor":
            raise ValueError(f"method spec {text!r}: only 'reanchor' takes config changes "
                             "('dflash' takes max_depth, draft_slots and verify_threshold)")
        if set(changes) & _CHAIN_FIELDS and method == "target":
            raise ValueError(f"method spec {text!r}: max_depth, draft_slots and verify_threshold apply to 'dflash' "
                             "and 'reanchor'")
        try:
            ReAnchorConfig().replace(**changes)  # bad values fail here, naming the field
        except (TypeError, ValueError) as err:
            raise ValueError(f"method spec {text!r}: {err}") from None
        return MethodSpec(label=text, method=method, changes=changes, auto_budget=auto, dtype=dtype,
                          draft_vocab=vocab, drafter=drafter, gate=gate, packed=packed)

    def config(self, base: ReAnchorConfig) -> ReAnchorConfig:
        """``base`` with this spec's changes (validated by `ReAnchorConfig`)."""
        return base.replace(**self.changes) if self.changes else base


def _convert(key: str, value: str) -> object:
    if key == "offsets":
        return tuple(int(v) for v in value.split("/") if v)
    if key in _INT_FIELDS:
        return int(value)
    if key in _FLOAT_FIELDS:
        return float(value)
    if key in _BOOL_FIELDS:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key} takes true/false, got {value!r}")
        return value.lower() in ("true", "1")
    return value


def parse_methods(texts: list[str], ablations: bool = False) -> list[MethodSpec]:
    """Specs from ``--methods`` (space- or comma-free items), plus `ABLATIONS` if asked; de-duplicated."""
    items = list(texts) + ([s for group in ABLATIONS.values() for s in group] if ablations else [])
    specs: list[MethodSpec] = []
    for text in items:
        spec = MethodSpec.parse(text)
        if spec.label not in {s.label for s in specs}:
            specs.append(spec)
    return specs

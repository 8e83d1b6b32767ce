"""`ReAnchorConfig`: how shifted blocks are drafted and attached to the draft tree.

Every field is checked when the config is built; a bad value raises `ValueError`
naming the field and the values it allows. The defaults are the paper's GPU setting
(offsets 1-3, ``earliest``, 48 nodes); on a CPU, where verified nodes are not free, the
cost model (`sglang_reanchor.bench.cost`) picks smaller trees by measured tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

AttachPolicy = Literal["earliest", "offset", "random", "longest_prefix"]
NoMatchFallback = Literal["skip", "offset"]
Region = Literal["all", "in_block", "beyond"]
BranchShape = Literal["chains", "best_first"]

ATTACH_POLICIES: tuple[str, ...] = ("earliest", "offset", "random", "longest_prefix")
NO_MATCH_FALLBACKS: tuple[str, ...] = ("skip", "offset")
REGIONS: tuple[str, ...] = ("all", "in_block", "beyond")
BRANCH_SHAPES: tuple[str, ...] = ("chains", "best_first")


@dataclass(frozen=True)
class ReAnchorConfig:
    """Settings of ReAnchor drafting (docs/design.md §1).

    Attributes
    ----------
    offsets:
        The shifted offsets ``D``: row ``d`` re-anchors the drafter at position
        ``s + d`` with the target's top-1 prediction there, conditioned on the
        first ``d`` rejected-suffix features. Distinct positive ints, sorted on
        construction. A row whose ``d`` exceeds the stored suffix is skipped.
    policy:
        Where a shifted block is attached to the baseline chain ``b, g1, ...``:
        ``"earliest"`` (smallest depth ``j`` with ``g_j == a_d``, the paper's
        default), ``"offset"`` (depth ``d`` whatever the token there),
        ``"random"`` (uniform among the matching depths) or
        ``"longest_prefix"`` (the match whose preceding baseline tokens agree
        longest with the rejected tokens preceding ``a_d``).
    root_site:
        Whether depth 0 (the root, the bonus token) counts as a match.
    fallback:
        What a matching policy does when no depth matches: ``"skip"`` the row
        or attach it at its ``"offset"``.
    node_budget:
        The most tree nodes sent to verification, root included. Nodes are
        kept in creation order (baseline, then rows by ascending ``d``, each
        row shallow to deep), so the deepest nodes of the last-attached rows go
        first.
    region:
        Ablation of the paper's Table 4: ``"all"`` keeps every attached node,
        ``"in_block"`` only nodes at depth ``<= B - 1``, ``"beyond"`` only nodes
        of shifted rows below depth ``B - 1`` (plus the whole baseline).
    batch_node_budget:
        The most tree nodes verified per round over a whole batch (SGLang serving):
        each of ``bs`` requests keeps at most ``batch_node_budget // bs`` nodes (at
        least 1), its lowest-numbered ones, so as the batch grows the trees fall
        back to a prefix of DFlash's chain, and the verify forward stays in the
        range where nodes are nearly free. None: ``node_budget`` per request at every
        batch size. The reference engine runs batch 1: it keeps
        ``min(node_budget, batch_node_budget)``.
    disable_by_batch_size:
        A batch of more than this many requests verifies every root alone (SGLang
        serving): a plain decode step, no drafter forward, as vLLM's speculative
        ``disable_by_batch_size`` does. For machines where a drafter forward and a
        few-node verify per request cost more at batch than the tokens they buy
        (a CPU serving a small target; 1: only a request alone drafts); None: draft
        at every batch size. The reference engine runs batch 1: it always drafts.
    max_depth:
        The deepest draft depth sent to verification (the root is depth 0), for
        the baseline chain and the shifted rows alike; None verifies the whole
        block (``B - 1`` drafts, DFlash's default). A weak drafter's deep drafts
        are almost never accepted, and on hardware where verify cost grows with
        the node count (CPUs) they are not free: the cost model picks this.
        Drafts past it are not computed either (no LM-head rows for them).
        With a cap, the ``region`` ablations see the capped block.
    draft_slots:
        Query slots per drafted block, anchor included (``[anchor, MASK x (W-1)]``);
        None runs the drafter's whole ``block_size``, as z-lab's DFlash does. Fewer
        slots make the drafter forward cheaper, but a slot then sees fewer masks
        after it than in training, so the drafts differ. Drafts deeper than
        ``draft_slots - 1`` are not made, whatever ``max_depth`` says.
    branch_width:
        Branching (`sglang_reanchor.branching`): alternatives per baseline slot, the
        drafter's 2nd .. ``1 + branch_width``-th choices (a Domino or DSpark head's over its
        corrected scores); 0 (the default) branches nowhere.
    branch_rows:
        Branches kept per round, the most likely first (each a short chain below the
        baseline; created after the shifted rows, so a node budget drops them first).
    branch_length:
        Tokens per branch: the alternative, then the baseline's next drafts (``"best_first"``:
        the most tokens a path keeps once it has left the baseline).
    branch_shape:
        ``"chains"`` (the default): each branch is one alternative followed by the baseline's
        own later drafts. ``"best_first"``: DDTree's tree, the ``node_budget - 1`` most likely
        paths over every slot's top ``1 + branch_width`` tokens, so a path may leave the
        baseline and then take a second or third choice again; its leaves off the baseline
        are the branches (at most ``branch_rows``).
    branch_temperature:
        Temperature of the drafter's distribution when branches are scored (a
        calibration of its confidence; chosen on development prompts).
    draft_vocab:
        Draft by an argmax over the ``K`` tokens the target writes most often (the
        drafter folder's ``draft_vocab.safetensors`` ranking; `sglang_reanchor.drafter.draft_vocab`)
        instead of its whole vocabulary: ``K / V`` of the drafter's LM-head work, which on
        a CPU is most of a drafter forward. Only the drafts change, never the output.
        None: the whole vocabulary.
    verify_threshold:
        Cut every drafted row where the running product of its drafts' probabilities
        (the drafter's softmax probability of each draft, `DraftHead.rollout_with_probs`)
        falls below this, so a round verifies deep drafts only where the drafter is sure
        of them: on hardware where verify cost grows with the node count (CPUs) the
        same tokens per round for fewer nodes. The baseline keeps at least one draft; a
        shifted row keeps its anchor; a row is attached only below a kept baseline node.
        Branches are cut by the same rule (`sglang_reanchor.branching`): a round then
        branches only where the drafter hesitates.
        Only the tree changes, never the output. None (the default): no cut.
    max_requests:
        Cap on the number of requests whose rejected suffix is held at once.
    seed:
        Seed of the generator behind ``policy="random"``.
    """

    offsets: tuple[int, ...] = (1, 2, 3)
    policy: AttachPolicy = "earliest"
    root_site: bool = False
    fallback: NoMatchFallback = "skip"
    node_budget: int = 48
    region: Region = "all"
    batch_node_budget: int | None = None
    disable_by_batch_size: int | None = None
    max_depth: int | None = None
    draft_slots: int | None = None
    branch_width: int = 0
    branch_rows: int = 4
    branch_length: int = 2
    branch_shape: BranchShape = "chains"
    branch_temperature: float = 1.0
    draft_vocab: int | None = None
    verify_threshold: float | None = None
    max_requests: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        offsets = self.offsets
        if isinstance(offsets, int) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in offsets
        ):
            raise ValueError(
                f"ReAnchorConfig.offsets must be a sequence of positive ints, got {offsets!r}"
            )
        offsets = tuple(sorted(offsets))
        if any(d < 1 for d in offsets) or len(set(offsets)) != len(offsets):
            raise ValueError(
                f"ReAnchorConfig.offsets must be distinct ints >= 1, got {self.offsets!r}"
            )
        object.__setattr__(self, "offsets", offsets)
        _check_choice("policy", self.policy, ATTACH_POLICIES)
        _check_choice("fallback", self.fallback, NO_MATCH_FALLBACKS)
        _check_choice("region", self.region, REGIONS)
        _check_choice("branch_shape", self.branch_shape, BRANCH_SHAPES)
        if not isinstance(self.root_site, bool):
            raise ValueError(f"ReAnchorConfig.root_site must be a bool, got {self.root_site!r}")
        if isinstance(self.branch_width, bool) or not isinstance(self.branch_width, int) or self.branch_width < 0:
            raise ValueError(f"ReAnchorConfig.branch_width must be an int >= 0 (0 = no branching), got {self.branch_width!r}")
        t = self.branch_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"ReAnchorConfig.branch_temperature must be a float > 0, got {t!r}")
        for name in ("node_budget", "max_requests", "branch_rows", "branch_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ReAnchorConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("batch_node_budget", "disable_by_batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"ReAnchorConfig.{name} must be None or an int >= 1, got {value!r}")
        if self.max_depth is not None and (
            isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int) or self.max_depth < 1
        ):
            raise ValueError(f"ReAnchorConfig.max_depth must be None or an int >= 1, got {self.max_depth!r}")
        if self.draft_slots is not None and (
            isinstance(self.draft_slots, bool) or not isinstance(self.draft_slots, int) or self.draft_slots < 2
        ):
            raise ValueError(f"ReAnchorConfig.draft_slots must be None or an int >= 2, got {self.draft_slots!r}")
        if self.draft_vocab is not None and (
            isinstance(self.draft_vocab, bool) or not isinstance(self.draft_vocab, int) or self.draft_vocab < 1
        ):
            raise ValueError(f"ReAnchorConfig.draft_vocab must be None or an int >= 1, got {self.draft_vocab!r}")
        v = self.verify_threshold
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
            raise ValueError(f"ReAnchorConfig.verify_threshold must be None or a float in (0, 1], got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"ReAnchorConfig.seed must be an int, got {self.seed!r}")

    @property
    def max_offset(self) -> int:
        """Largest offset: the rejected-suffix length worth storing."""
        return max(self.offsets, default=0)

    def replace(self, **changes: object) -> ReAnchorConfig:
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(
            f"ReAnchorConfig.{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}"
        )

"""Run-time node budget: each round verifies the tree size with the best expected tokens/s.

A round that verifies ``b`` tree nodes yields ``tau(b)`` tokens and costs
``verify(b) + fixed`` seconds (``fixed``: the drafter forward and the rest of the
round). On a GPU ``verify`` is nearly flat up to ~64 nodes; on a CPU it grows with
``b``, so the best budget depends on the machine *and* on how well the drafter is
doing on this request. `BudgetPolicy` holds the measured cost curve
(``python -m sglang_reanchor.bench cost`` measures it; ``CostProfile.budget_policy``
builds the policy); `BudgetState` is one request's running estimate of ``tau(b)``
for each candidate ``b`` and picks ``argmax_b tau(b) / (verify(b) + fixed)``
before every round.

``tau(b)`` is known without verifying ``b`` nodes: tree nodes are numbered parents
first and a budget keeps the lowest ids (`tree.build_draft_tree`), so a round
verified with budget ``B`` tells what every ``b <= B`` would have accepted: the
nodes of its accepted path with id ``< b`` (exact at T = 0, where acceptance
follows the target's argmax). Larger candidates are seen in exploration rounds:
the first round and every ``explore_every``-th verify the largest candidate.
Estimates are exponential moving averages, so the choice follows a request whose
text gets easier or harder to draft. The budget decides how many nodes are
verified, never which token is accepted: the output is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["BatchBudget", "BudgetPolicy", "BudgetState", "GateState", "SpeculationGate", "interpolate"]


def interpolate(table: Mapping[int, float], x: float) -> float:
    """Piecewise-linear interpolation of ``table`` at ``x`` (linear extrapolation past the ends)."""
    xs = sorted(table)
    if not xs:
        raise ValueError("interpolate: empty table")
    if len(xs) == 1:
        return table[xs[0]]
    lo = max([k for k in xs if k <= x], default=xs[0])
    i = xs.index(lo)
    a, b = (xs[i], xs[i + 1]) if i + 1 < len(xs) else (xs[-2], xs[-1])
    return table[a] + (table[b] - table[a]) * (x - a) / (b - a)


@dataclass(frozen=True)
class BudgetPolicy:
    """Measured costs and the candidate budgets (see the module docstring).

    Parameters
    ----------
    verify_seconds:
        Tree nodes -> seconds of one target forward over that many nodes
        (interpolated between the measured sizes).
    fixed_seconds:
        Seconds per round that do not depend on the budget (drafter forward, tree,
        acceptance, cache updates).
    candidates:
        Budgets to choose from (>= 1, any order).
    explore_every:
        Every this many rounds, verify the largest candidate to keep its estimate fresh.
    decay:
        Weight of the old estimate in the moving average, in ``[0, 1)``.
    """

    verify_seconds: Mapping[int, float]
    fixed_seconds: float = 0.0
    candidates: tuple[int, ...] = (8, 16, 24, 32, 48, 64)
    explore_every: int = 8
    decay: float = 0.9

    def __post_init__(self) -> None:
        if not self.verify_seconds or any(float(s) <= 0 for s in self.verify_seconds.values()):
            raise ValueError(f"BudgetPolicy.verify_seconds must map node counts to seconds > 0, "
                             f"got {dict(self.verify_seconds)!r}")
        cands = tuple(sorted(set(self.candidates)))
        if not cands or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in cands):
            raise ValueError(f"BudgetPolicy.candidates must be ints >= 1, got {self.candidates!r}")
        object.__setattr__(self, "candidates", cands)
        if self.fixed_seconds < 0:
            raise ValueError(f"BudgetPolicy.fixed_seconds must be >= 0, got {self.fixed_seconds!r}")
        if isinstance(self.explore_every, bool) or not isinstance(self.explore_every, int) or self.explore_every < 1:
            raise ValueError(f"BudgetPolicy.explore_every must be an int >= 1, got {self.explore_every!r}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"BudgetPolicy.decay must be in [0, 1), got {self.decay!r}")

    def round_seconds(self, nodes: float) -> float:
        """Predicted seconds of a round that verifies ``nodes`` tree nodes."""
        return interpolate(self.verify_seconds, nodes) + self.fixed_seconds

    def start(self) -> BudgetState:
        """A fresh per-request state."""
        return BudgetState(self)


@dataclass
class BudgetState:
    """One request's estimates of ``tau(b)`` and of the nodes ``b`` would verify."""

    policy: BudgetPolicy
    tau: dict[int, float] = field(default_factory=dict)  # candidate -> moving-average tau
    nodes: dict[int, float] = field(default_factory=dict)  # candidate -> moving-average tree size
    rounds: int = 0

    def next_budget(self) -> int:
        """The budget for the coming round."""
        p = self.policy
        if self.rounds % p.explore_every == 0 or len(self.tau) < len(p.candidates):
            return p.candidates[-1]
        # ties go to the smaller budget (max keeps the first of equal keys)
        return max(p.candidates, key=lambda b: self.tau[b] / p.round_seconds(self.nodes[b]))

    def observe(self, accepted_nodes: Tensor, budget: int, num_nodes: int) -> None:
        """Record a round verified with ``budget``: ``accepted_nodes`` ``[t]`` are the node
        ids of its accepted path, root (id 0) included (``tau = t``); ``num_nodes`` the
        nodes it verified (fewer than ``budget`` when the tree was smaller)."""
        self.rounds += 1
        for b in self.policy.candidates:
            if b > budget:
                break
            self._update(self.tau, b, float((accepted_nodes < b).sum()))
            self._update(self.nodes, b, float(min(b, num_nodes)))

    def _update(self, table: dict[int, float], key: int, value: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else self.policy.decay * old + (1 - self.policy.decay) * value


@dataclass
class BatchBudget:
    """A server's node budget per request, chosen each round for the batch it verifies.

    One verify forward scores every node of every request, so a batch of ``bs``
    requests with budget ``b`` each costs ``verify(bs * b)`` plus the drafter forward
    over ``bs * blocks_per_request`` blocks, and yields ``bs * tau(b)`` tokens. Each
    round takes ``argmax_b bs * tau(b) / (verify(bs * b) + draft(bs * blocks) + fixed)``:
    with one request the full tree, as the batch grows fewer nodes each, down to
    ``b = 1`` (the root alone: no drafter forward, plain decoding's cost). ``tau(b)``
    is pooled over the requests (a moving average of the batch mean), learnt as in
    `BudgetState`: a round verified with ``B`` tells every ``b <= B``. Exploration: once,
    the largest candidate whose batch stays inside the measured verify curve; then every
    ``explore_every``-th round the largest one whose round costs at most ``explore_cost``
    times the chosen one, so that a big batch that pays for the root alone is not made to
    verify wide trees, again and again, to learn what it would not choose. An exploration
    round whose tokens (over its expected time) fall short of what the chosen budget was
    expected to deliver doubles that batch size's interval (up to ``max_explore_every``);
    one that beats it restores ``explore_every``. Measured round times correct the profile per batch size and budget (`record_seconds`). The budget
    never changes which token is accepted.

    Parameters
    ----------
    verify_seconds:
        Verify tokens (all requests together) -> seconds of one target forward.
    draft_seconds:
        Drafter blocks -> seconds of one drafter forward.
    blocks_per_request:
        ``1 + |D|``: blocks drafted per request.
    fixed_seconds:
        Per round, besides the two forwards.
    candidates:
        Per-request budgets to choose from (1 is always added).
    explore_cost:
        Most an exploration round may cost, in rounds of the chosen budget (>= 1).
    explore_every, max_explore_every:
        Rounds between explorations at one batch size: at first, and at most after they back off.
    """

    verify_seconds: Mapping[int, float]
    draft_seconds: Mapping[int, float]
    blocks_per_request: int
    fixed_seconds: float = 0.0
    candidates: tuple[int, ...] = (2, 4, 8, 16)
    explore_every: int = 8
    explore_cost: float = 1.5
    decay: float = 0.9
    max_explore_every: int = 64
    tau: dict[int, float] = field(default_factory=dict)
    rounds: int = 0
    explore_gap: dict[int, int] = field(default_factory=dict)  # batch size -> rounds between its explorations
    # batch size -> (the budget it explores this round, the tokens/s expected of the one it would have chosen)
    probes: dict[int, tuple[int, float]] = field(default_factory=dict)
    # (batch size, budget) -> measured / predicted seconds: serving's extra cost per round
    # (host work, the drafter's batch) differs with both
    correction: dict[tuple[int, int], float] = field(default_factory=dict)
    warmed: set[tuple[int, int]] = field(default_factory=set)  # keys whose first (cold) round was seen

    def __post_init__(self) -> None:
        for name in ("verify_seconds", "draft_seconds"):
            table = getattr(self, name)
            if not table or any(float(s) <= 0 for s in table.values()):
                raise ValueError(f"BatchBudget.{name} must map sizes to seconds > 0, got {dict(table)!r}")
        cands = tuple(sorted(set(self.candidates) | {1}))
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in cands):
            raise ValueError(f"BatchBudget.candidates must be ints >= 1, got {self.candidates!r}")
        self.candidates = cands
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"BatchBudget.decay must be in [0, 1), got {self.decay!r}")
        if not self.explore_cost >= 1.0:
            raise ValueError(f"BatchBudget.explore_cost must be >= 1, got {self.explore_cost!r}")
        every, most = self.explore_every, self.max_explore_every
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (every, most)) or not 1 <= every <= most:
            raise ValueError(f"BatchBudget.explore_every and max_explore_every must be ints with 1 <= explore_every "
                             f"<= max_explore_every, got {every!r} and {most!r}")
        self.tau.setdefault(1, 1.0)  # the root alone: always the bonus token

    def predicted_seconds(self, bs: int, budget: int) -> float:
        """The profile's seconds for a round of ``bs`` requests verifying ``budget`` nodes each."""
        draft = 0.0 if budget == 1 else interpolate(self.draft_seconds, bs * self.blocks_per_request)
        return interpolate(self.verify_seconds, bs * budget) + draft + self.fixed_seconds

    def round_seconds(self, bs: int, budget: int) -> float:
        """Expected seconds of such a round: the profile's, times what `record_seconds` measured
        of rounds of this batch size and budget (else the mean correction of this budget's
        rounds at other sizes, else of all rounds)."""
        known = self.correction.get((bs, budget))
        if known is None:
            same = [r for (_, b), r in self.correction.items() if b == budget]
            pool = same or list(self.correction.values())
            known = sum(pool) / len(pool) if pool else 1.0
        return self.predicted_seconds(bs, budget) * known

    def record_seconds(self, bs: int, budget: int, seconds: float) -> None:
        """A round's measured wall time: the profile (measured outside the server, on one
        request's forward) misses what serving adds per round (scheduling, KV moves,
        draft-KV writes, a batch's drafter forward), which weighs most on the cheapest rounds.
        The first round of each (batch size, budget) is not recorded: its new shapes allocate and
        pick kernels (served on a CPU, a first 6-node round took 2.9x the profile's time, and that
        one figure, never refreshed, kept the server from exploring trees ever again)."""
        if (bs, budget) not in self.warmed:
            self.warmed.add((bs, budget))
            return
        ratio = seconds / self.predicted_seconds(bs, budget)
        old = self.correction.get((bs, budget))
        self.correction[(bs, budget)] = ratio if old is None else self.decay * old + (1 - self.decay) * ratio

    def expected_rates(self, bs: int) -> dict[int, float]:
        """Tokens/s a round of ``bs`` requests is expected to deliver, per budget with an estimate
        (what `choose` compares; the trace records it beside what the round delivered)."""
        return {b: bs * tau / self.round_seconds(bs, b) for b, tau in sorted(self.tau.items())}

    def choose(self, bs: int) -> int:
        """The per-request budget for the coming round of ``bs`` requests: the best expected
        tokens/s among the budgets with an estimate, or an exploration round (the class docstring)."""
        rates = self.expected_rates(bs)
        best = max(rates, key=rates.__getitem__)  # ties: the smaller (the keys are sorted)
        self.probes.pop(bs, None)  # an exploration chosen but never observed
        measured = max(self.verify_seconds)
        inside = [b for b in self.candidates if bs * b <= measured]
        if inside and inside[-1] not in self.tau:  # once: an estimate of every budget this batch could verify
            return inside[-1]
        if self.rounds % self.explore_gap.get(bs, self.explore_every) == 0:  # keep them fresh, at a bounded cost
            limit = self.explore_cost * self.round_seconds(bs, best)
            wider = [b for b in inside if b > best and self.round_seconds(bs, b) <= limit]
            if wider:
                self.probes[bs] = (wider[-1], rates[best])
                return wider[-1]
        return best

    def observe(self, accepted_nodes: Tensor, budget: int) -> None:
        """Record a round: ``accepted_nodes`` ``[bs, T]`` (node ids of each accepted path,
        root included, -1 padded), verified with ``budget`` nodes per request."""
        self.rounds += 1
        bs = accepted_nodes.shape[0]
        probe = self.probes.pop(bs, None)  # this round explored (or one before it was never observed)
        on_path = accepted_nodes >= 0
        for b in self.candidates:
            if b > budget:
                break
            if b == 1:
                continue
            value = float((on_path & (accepted_nodes < b)).sum(1).float().mean())
            old = self.tau.get(b)
            self.tau[b] = value if old is None else self.decay * old + (1 - self.decay) * value
            if probe is not None and probe[0] == b == budget:  # an exploration round: did it pay?
                gap = self.explore_gap.get(bs, self.explore_every)
                paid = bs * value / self.round_seconds(bs, b) > probe[1]
                self.explore_gap[bs] = self.explore_every if paid else min(2 * gap, self.max_explore_every)


@dataclass(frozen=True)
class SpeculationGate:
    """Speculate only while it pays, as measured on this request and this machine.

    A speculative round that yields ``tau`` tokens in ``t`` seconds beats plain decoding
    when ``tau / t > 1 / t_plain``. Where a round costs several decode steps (a CPU
    without fast bfloat16, a prompt far from the drafter's training data) it does not,
    and every round then loses time to plain decoding. `GateState` keeps moving averages
    of both rates, measured by the engine's own clock, and runs plain decode steps while
    the request's speculative rate is below plain decoding's; a speculative round then
    probes again after ``probe_every`` steps, and after twice as many each time the probe
    loses (up to ``max_probe_every``), so that a request whose text gets easier to draft
    returns to speculation at a bounded cost. A plain step produces the target's own
    token: the gate changes the time, never the output.

    Parameters
    ----------
    probe_every:
        Plain steps before the first probe round (>= 1).
    max_probe_every:
        Most plain steps between probes (>= ``probe_every``).
    decay:
        Weight of the old estimate in the moving averages, in ``[0, 1)``.
    """

    probe_every: int = 4
    max_probe_every: int = 64
    decay: float = 0.7

    def __post_init__(self) -> None:
        for name in ("probe_every", "max_probe_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SpeculationGate.{name} must be an int >= 1, got {value!r}")
        if self.max_probe_every < self.probe_every:
            raise ValueError(f"SpeculationGate.max_probe_every ({self.max_probe_every}) must be >= probe_every "
                             f"({self.probe_every})")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"SpeculationGate.decay must be in [0, 1), got {self.decay!r}")

    def start(self) -> GateState:
        """A fresh per-request state."""
        return GateState(self, interval=self.probe_every)


@dataclass
class GateState:
    """One request's speculative and plain rates (tokens per second), and when to probe."""

    gate: SpeculationGate
    interval: int  # plain steps before the next probe
    spec_rate: float | None = None  # moving average of tau / round seconds
    plain_rate: float | None = None  # moving average of 1 / step seconds
    plain_since_probe: int = 0

    def speculate(self) -> bool:
        """Whether the coming step is a speculative round (else a plain decode step)."""
        if self.spec_rate is None:
            return True  # measure a round first ...
        if self.plain_rate is None:
            return False  # ... then a plain step
        if self.spec_rate >= self.plain_rate:
            return True
        return self.plain_since_probe >= self.interval

    def observe_round(self, tokens: int, seconds: float) -> None:
        """A speculative round committed ``tokens`` in ``seconds``."""
        rate = tokens / max(seconds, 1e-9)
        if self.plain_rate is not None and self.spec_rate is not None and self.spec_rate < self.plain_rate:
            # a probe: one that loses to plain decoding waits twice as long for the next
            lost = rate < self.plain_rate
            self.interval = min(2 * self.interval, self.gate.max_probe_every) if lost else self.gate.probe_every
        self.spec_rate = self._mix(self.spec_rate, rate)
        self.plain_since_probe = 0

    def observe_plain(self, seconds: float) -> None:
        """A plain decode step took ``seconds``."""
        self.plain_rate = self._mix(self.plain_rate, 1.0 / max(seconds, 1e-9))
        self.plain_since_probe += 1

    def _mix(self, old: float | None, value: float) -> float:
        return value if old is None else self.gate.decay * old + (1 - self.gate.decay) * value

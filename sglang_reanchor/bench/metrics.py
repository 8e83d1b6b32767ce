"""Per-response records and the headline metrics (DFlash's definitions, notes/dflash.md §2).

- **tau** (acceptance length): per verify round, accepted drafts + 1 (the bonus
  counts); averaged over a response's rounds, then over responses (not token
  weighted). Plain decoding has tau = 1.
- **tokens/s**: ``1 / mean(TPOT)`` with ``TPOT = seconds / new tokens`` per
  response, end to end (prefill + decode).
- **speedup**: ``mean TPOT(target) / mean TPOT(method)``, both from the same run
  (methods interleaved per prompt).

A *response* is one assistant turn: MT-Bench gives two per question.

>>> recs = [Record("d", "0", 0, "dflash", 6, [2, 4], 1.0, 0.1, 2),
...         Record("d", "1", 0, "dflash", 4, [4], 1.0, 0.1, 1)]
>>> summarize(recs)["d"]["dflash"]["tau"]   # (3 + 4) / 2, not 10 / 3
3.5
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

__all__ = ["Record", "baseline_method", "identity_report", "merge_counts", "summarize", "token_hash"]


def token_hash(ids: list[int]) -> str:
    """First 16 hex digits of the SHA-256 of the ids (as little-endian int32).

    >>> token_hash([1, 2, 3]) == token_hash([1, 2, 3]) != token_hash([1, 2])
    True
    """
    import hashlib
    import struct

    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()[:16]


def baseline_method(records: list[Record]) -> str:
    """The plain-decoding method every speedup is taken against: of the ``target``
    methods of the run (e.g. ``target`` and ``target:dtype=bfloat16``), the one with the
    lowest mean TPOT over all its responses (the fastest plain decoding)."""
    tpots: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.method == "target" or r.method.startswith("target:"):
            tpots[r.method].append(r.tpot)
    if not tpots:
        return "target"
    return min(tpots, key=lambda m: _mean(tpots[m]))


def identity_report(records: list[Record]) -> dict[str, dict[str, float]]:
    """Token identity per precision, from the stored hashes: for each dtype, in how many
    responses every method of that dtype emitted the same ids; and, across dtypes, the
    share of responses and of token positions (up to the first difference) on which
    each dtype's first method agrees with the baseline precision's.

    The precision of a response's *first* method decides later turns' prompts, so
    only first turns are compared across dtypes."""
    groups: dict[tuple[str, str, int, str], list[Record]] = defaultdict(list)
    for r in records:
        if r.method != "diagnostic":
            groups[(r.dataset, r.sample, r.turn, r.dtype)].append(r)
    out: dict[str, dict] = {}
    for dtype in sorted({k[3] for k in groups}):
        keys = [k for k in groups if k[3] == dtype]
        same = sum(len({r.token_hash for r in groups[k]}) == 1 for k in keys)
        out[dtype] = {"responses": len(keys), "identical": same, "methods": _agreement_by_method(groups, keys)}
    dtypes = sorted(out)
    if len(dtypes) > 1:
        base = next((r.dtype for r in records if r.method == baseline_method(records)), dtypes[0])
        for other in (d for d in dtypes if d != base):
            resp = agree = tok = tot = 0
            for (ds, sample, turn, dtype), recs in groups.items():
                peer = groups.get((ds, sample, turn, other))
                if dtype != base or turn != 0 or not peer:
                    continue
                a, b = recs[0].token_ids, peer[0].token_ids
                n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                resp += 1
                agree += a == b
                tok += n
                tot += max(len(a), len(b))
            out[other] |= {f"agree_with_{base}_responses": agree, "compared_responses": resp,
                           f"agree_with_{base}_token_share": tok / tot if tot else float("nan")}
    return out


def _agreement_by_method(groups: dict, keys: list) -> dict[str, dict[str, float]]:
    """Per method of one precision, against that precision's plain decoding (its
    ``target`` method, else its first): responses with the same ids, and the share of
    token positions before the first difference. Where a bfloat16 tree verify and a
    one-token bfloat16 forward round a near-tie differently, this is how often."""
    out: dict[str, dict[str, float]] = {}
    for k in keys:
        recs = groups[k]
        ref = next((r for r in recs if r.method.split(":")[0] == "target"), recs[0])
        for r in recs:
            if r is ref:
                continue
            a, b = ref.token_ids, r.token_ids
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            m = out.setdefault(r.method, {"reference": ref.method, "responses": 0, "identical": 0,
                                          "tokens_before_difference": 0, "tokens": 0, "largest_gap_float32": None})
            gap = r.stats.get("divergence", {}).get("gap_float32")
            if gap is not None:  # a divergence explained by `Runner`: the target's logit gap there
                m["largest_gap_float32"] = max(abs(gap), m["largest_gap_float32"] or 0.0)
            m["responses"] += 1
            m["identical"] += a == b
            m["tokens_before_difference"] += n
            m["tokens"] += max(len(a), len(b))
    for m in out.values():
        m["token_share"] = m["tokens_before_difference"] / m["tokens"] if m["tokens"] else float("nan")
    return out


@dataclass
class Record:
    """One response of one method."""

    dataset: str
    sample: str
    turn: int
    method: str  # the method spec label
    tokens: int  # new tokens (EOS included when reached)
    taus: list[int]  # per verify round (empty for target)
    seconds: float  # prefill + decode
    prefill_seconds: float
    rounds: int  # verify rounds (target forwards for "target")
    plain_steps: int = 0  # plain decode steps a gate ran instead of rounds (gate=1)
    tree_sizes: list[int] = field(default_factory=list)
    shifted_accepts: list[int] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # analysis counts (see analysis.py)
    finish_reason: str = "length"
    dtype: str = ""  # precision the method ran in
    token_hash: str = ""  # `token_hash` of the emitted ids: equal hashes = identical tokens
    token_ids: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else 1.0

    @property
    def tpot(self) -> float:
        return self.seconds / max(self.tokens, 1)

    def to_json(self) -> dict:
        return asdict(self)


def merge_counts(records: list[Record], key: str) -> dict[str, int]:
    """Sum the ``stats[key]`` count dicts of ``records``."""
    total: dict[str, int] = defaultdict(int)
    for r in records:
        for k, v in r.stats.get(key, {}).items():
            total[k] += v
    return dict(total)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(records: list[Record], baseline: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """``{dataset: {method: metrics}}`` plus an ``"all"`` pseudo-dataset; speedups are
    over ``baseline`` (default: `baseline_method`, the fastest plain decoding).

    ``"all"`` averages the per-dataset tau and speedup equally (as the paper
    averages benchmarks), and pools responses for tokens/s.
    """
    baseline = baseline or baseline_method(records)
    by: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[r.dataset][r.method].append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for ds, methods in by.items():
        base = methods.get(baseline)
        base_tpot = _mean([r.tpot for r in base]) if base else float("nan")
        out[ds] = {}
        for m, recs in methods.items():
            tpot = _mean([r.tpot for r in recs])
            sizes = [s for r in recs for s in r.tree_sizes]
            accepted = sum(sum(r.taus) - len(r.taus) for r in recs)
            out[ds][m] = {
                "responses": len(recs),
                "tokens": sum(r.tokens for r in recs),
                "rounds": sum(r.rounds for r in recs),
                "plain_steps": sum(r.plain_steps for r in recs),
                "tau": _mean([r.tau for r in recs]),
                "tokens_per_s": 1.0 / tpot if tpot > 0 else float("nan"),
                "speedup": base_tpot / tpot if tpot > 0 else float("nan"),
                "mean_tree_size": _mean([float(s) for s in sizes]),
                "shifted_share": (sum(sum(r.shifted_accepts) for r in recs) / accepted) if accepted else float("nan"),
            }
    if len(out) > 1:
        method_names = {m for ds in out.values() for m in ds}
        out["all"] = {}
        for m in method_names:
            rows = [out[ds][m] for ds in out if ds != "all" and m in out[ds]]
            pooled = [r.tpot for r in records if r.method == m]
            out["all"][m] = {
                "responses": sum(x["responses"] for x in rows),
                "tokens": sum(x["tokens"] for x in rows),
                "rounds": sum(x["rounds"] for x in rows),
                "plain_steps": sum(x["plain_steps"] for x in rows),
                "tau": _mean([x["tau"] for x in rows]),
                "tokens_per_s": 1.0 / _mean(pooled) if pooled else float("nan"),
                "speedup": _mean([x["speedup"] for x in rows]),
                "mean_tree_size": _mean([x["mean_tree_size"] for x in rows if x["mean_tree_size"] == x["mean_tree_size"]]),
                "shifted_share": _mean([x["shifted_share"] for x in rows if x["shifted_share"] == x["shifted_share"]]),
            }
    return out

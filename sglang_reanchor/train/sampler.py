"""The data cursor: which sequences each training step draws, resumable exactly.

Each draw of a step picks a group with the mix's probabilities (from a generator seeded
by ``(seed, step)``), then the group's next sequence in an epoch permutation: group
``g`` walks ``perm(g, 0)``, then ``perm(g, 1)``, ... (each a seeded ``randperm`` of its
members), so within a group every sequence is seen once per epoch before any is seen
twice. The cursor is the number of draws taken from each group; `state_dict` /
`load_state_dict` carry it across sittings, so a resumed run draws the batches an
uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["GroupSampler"]


class GroupSampler:
    """Draws sequence indices by group (see the module docstring).

    ``groups[i]`` is sequence ``i``'s group; ``mix`` maps group -> weight (None: one
    group holding every sequence, whatever ``groups`` says). Groups absent from ``mix``
    are never drawn; weights of groups with no sequence are dropped.
    """

    def __init__(self, groups: Sequence[str], mix: dict[str, float] | None, seed: int) -> None:
        if mix is None:
            groups, mix = ["all"] * len(groups), {"all": 1.0}
        bad = {g: w for g, w in mix.items() if not w >= 0}
        if bad:
            raise ValueError(f"mix weights must be >= 0, got {bad}")
        members: dict[str, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        self.names = sorted(g for g, w in mix.items() if w > 0 and members.get(g))
        if not self.names:
            raise ValueError(f"mix {mix} gives no weight to any group present ({sorted(members)})")
        self.members = {g: torch.tensor(members[g]) for g in self.names}
        w = torch.tensor([float(mix[g]) for g in self.names], dtype=torch.float64)
        self.probs = w / w.sum()
        self.seed = seed
        self.counts = {g: 0 for g in self.names}
        self._perm: dict[tuple[str, int], torch.Tensor] = {}

    def _permutation(self, g: str, epoch: int) -> torch.Tensor:
        key = (g, epoch)
        if key not in self._perm:
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.names.index(g)) * 7_919 + epoch)
            self._perm = {k: v for k, v in self._perm.items() if k[0] != g}  # keep one epoch per group
            self._perm[key] = self.members[g][torch.randperm(self.members[g].numel(), generator=gen)]
        return self._perm[key]

    def draw(self, step: int, num: int) -> list[int]:
        """The ``num`` sequence indices of training step ``step`` (advances the cursor)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 104_729)
        picks = torch.multinomial(self.probs, num, replacement=True, generator=gen).tolist()
        out = []
        for p in picks:
            g = self.names[p]
            n = self.members[g].numel()
            j = self.counts[g]
            out.append(int(self._permutation(g, j // n)[j % n]))
            self.counts[g] = j + 1
        return out

    def epochs(self) -> dict[str, float]:
        """Passes over each group so far (draws / members)."""
        return {g: self.counts[g] / self.members[g].numel() for g in self.names}

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "sizes": {g: int(m.numel()) for g, m in self.members.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor. A group whose size changed (data added between sittings)
        keeps its draw count: its later epochs are permutations of the new members."""
        for g, c in state["counts"].items():
            if g in self.counts:
                self.counts[g] = int(c)

"""Drafter training loop: `Trainer` (one optimizer step at a time), `fit`, `export`.

One step draws ``batch_seqs`` sequences and ``anchors_per_seq`` anchors in each (a pure
function of ``(seed, step)``, so a resumed run sees the same batches as an
uninterrupted one), projects the cached target features into context K/V, runs every
block of the batch in one drafter forward under `block_mask`, and applies
`dflash_loss`. Only the drafter trains: the target's embeddings and ``lm_head`` are
frozen and borrowed. AdamW, linear warmup then cosine decay to 10 % (over ``total_steps``, or over the
wall-clock budget ``minutes`` when that ends first), grad-norm clip 1.

`fit` wraps it with a tqdm bar, a JSON-lines log, atomic checkpoints
(``OUT/ckpt.pt``: drafter, optimizer, step, elapsed time, history) and validation
acceptance length: mean over held-out prompts of the per-prompt mean tau of
``SpeculativeGenerator.generate(method="dflash")`` at T=0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..drafter import DFlashConfig, DFlashDrafter
from .data import Sequences, chat_ids, load_sequences
from .loss import IGNORE, block_inputs, block_labels, block_mask, dflash_loss, sample_anchors
from .plots import save_tau_figure

__all__ = ["TrainSettings", "Trainer", "export", "fit", "init_from_target", "training_curve", "validation_tau"]


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 6e-4
    warmup_steps: int = 50
    total_steps: int = 2000  # length of the cosine schedule (and the stop, unless `minutes` hits first)
    minutes: float | None = None  # wall-clock stop, summed over sittings
    batch_seqs: int = 4
    anchors_per_seq: int = 16
    gamma: float = 7.0
    sample_slots: bool = True  # score slot k with probability w_k (unbiased, ~2x cheaper lm_head)
    weight_decay: float = 0.01
    clip: float = 1.0
    chunk_tokens: int = 1024
    eval_every: int = 200
    save_every: int = 50
    val_prompts: int = 8  # held-out prompts used during training (all of them at the end)
    val_max_new_tokens: int = 64
    seed: int = 0
    init_from_target: bool = True
    autocast: bool = True  # bfloat16 autocast for the forward (AMX on these CPUs); fp32 master weights


def init_from_target(drafter: DFlashDrafter, target: PreTrainedModel) -> None:
    """Copy the target's last decoder layers (and final norm) into the drafter where the
    shapes match: a warm start that already maps a residual stream to the target's
    ``lm_head`` space. q_norm/k_norm (absent in Llama) stay at 1."""
    layers = target.model.layers
    src_layers = layers[len(layers) - len(drafter.layers):]
    with torch.no_grad():
        for dst, src in zip(drafter.layers, src_layers, strict=True):
            src_state = src.state_dict()
            for name, p in dst.state_dict().items():
                if name in src_state and src_state[name].shape == p.shape:
                    p.copy_(src_state[name])
        drafter.norm.weight.copy_(target.model.norm.weight)


class Trainer:
    """Optimizer steps of a drafter on cached target features (see the module docstring)."""

    def __init__(self, target: PreTrainedModel, drafter: DFlashDrafter, data: Sequences,
                 settings: TrainSettings) -> None:
        self.target, self.drafter, self.data, self.settings = target.eval(), drafter, data, settings
        for p in target.parameters():
            p.requires_grad_(False)
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.opt = torch.optim.AdamW(drafter.parameters(), lr=settings.lr, betas=(0.9, 0.95),
                                     weight_decay=settings.weight_decay, fused=True)
        self.step_count = 0

    def lr_at(self, step: int, time_fraction: float = 0.0) -> float:
        """Linear warmup, then cosine to 10 % by ``total_steps`` or, when a wall-clock
        budget is set, by the end of it (``time_fraction``: share of ``minutes`` used),
        whichever comes first: a run stopped by its budget still ends its schedule."""
        s = self.settings
        if step < s.warmup_steps:
            return s.lr * (step + 1) / s.warmup_steps
        t = min(1.0, max((step - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps), time_fraction))
        return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    def batch(self, step: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The batch of ``step``: ids ``[bs, T]``, features ``[bs, T, K*H]`` (float32),
        seq_lens ``[bs]``, anchors ``[bs, N]``; deterministic in ``(seed, step)``."""
        g = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + step)
        idx = torch.randint(len(self.data), (self.settings.batch_seqs,), generator=g).tolist()
        items = [self.data.get(i) for i in idx]
        width = max(ids.shape[0] for ids, _, _ in items)
        kh = items[0][2].shape[1]
        ids = torch.zeros(len(items), width, dtype=torch.long)
        feats = torch.zeros(len(items), width, kh, dtype=torch.float32)
        for r, (x, _, f) in enumerate(items):
            ids[r, : x.shape[0]] = x
            feats[r, : x.shape[0]] = f.float()
        lens = torch.tensor([x.shape[0] for x, _, _ in items])
        plens = torch.tensor([p for _, p, _ in items])
        anchors = sample_anchors(plens, lens, self.settings.anchors_per_seq, g)
        return ids, feats, lens, anchors

    def loss_on(self, ids: Tensor, feats: Tensor, lens: Tensor, anchors: Tensor,
                slot_generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Loss and per-slot accuracy of the drafter on one batch (see `dflash_loss`;
        ``slot_generator`` draws the scored slots, None scores all)."""
        d = self.drafter
        dev = d.fc.weight.device
        ids, feats, lens, anchors = ids.to(dev), feats.to(dev), lens.to(dev), anchors.to(dev)
        bs, width = ids.shape
        ctx_pos = torch.arange(width, device=dev).expand(bs, width)
        context = d.project_context(feats, ctx_pos)
        q_ids, q_pos = block_inputs(ids, anchors, d.block_size, d.mask_token_id)
        with torch.no_grad():
            q_emb = self.embed(q_ids)
        hidden = d(q_emb, q_pos, context, block_mask(anchors, width, d.block_size))
        labels = block_labels(ids, anchors, lens, d.block_size)
        return dflash_loss(hidden, labels, self.lm_head, self.settings.gamma, self.settings.chunk_tokens,
                           sample_slots=slot_generator)

    def _autocast(self) -> torch.autocast:
        dev = self.drafter.fc.weight.device.type
        return torch.autocast(dev, dtype=torch.bfloat16, enabled=self.settings.autocast)

    def step(self, time_fraction: float = 0.0) -> dict[str, Any]:
        """One optimizer step; returns ``{"step", "loss", "lr", "acc"}`` (acc per slot).
        ``time_fraction``: share of the wall-clock budget used so far (see `lr_at`)."""
        self.drafter.train()
        lr = self.lr_at(self.step_count, time_fraction)
        for group in self.opt.param_groups:
            group["lr"] = lr
        slots = None
        if self.settings.sample_slots:  # deterministic in (seed, step), like the batch
            slots = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + self.step_count + 7_919)
        ids, feats, lens, anchors = self.batch(self.step_count)
        with self._autocast():
            loss, acc = self.loss_on(ids, feats, lens, anchors, slot_generator=slots)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.settings.clip)
        self.opt.step()
        self.step_count += 1
        labelled = int((block_labels(ids, anchors, lens, self.drafter.block_size) != IGNORE).sum())
        return {"step": self.step_count, "loss": float(loss.detach()), "lr": lr, "acc": acc.tolist(),
                "labels": labelled}

    def state_dict(self) -> dict[str, Any]:
        return {"drafter": self.drafter.state_dict(), "optimizer": self.opt.state_dict(),
                "step": self.step_count, "config": self.drafter.config.to_dict(),
                "settings": dataclasses.asdict(self.settings)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.opt.load_state_dict(state["optimizer"])
        self.step_count = int(state["step"])


def _save_atomic(obj: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def validation_tau(target: PreTrainedModel, drafter: DFlashDrafter, prompts: list[list[int]],
                   max_new_tokens: int) -> float:
    """Mean over prompts of the mean acceptance length of plain DFlash at T=0."""
    from ..engine import SpeculativeGenerator

    was_training = drafter.training
    gen = SpeculativeGenerator(target, drafter)
    taus = [gen.generate(p, max_new_tokens, method="dflash").mean_acceptance_length for p in prompts]
    drafter.train(was_training)
    return sum(taus) / len(taus)


def fit(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: DFlashConfig,
        data_dir: str | Path | Sequence[str | Path], out: str | Path, settings: TrainSettings, *,
        resume: bool = False, init_from: str | Path | None = None) -> Path:
    """Train (or, with ``resume``, continue) a drafter on one or more data folders (the
    first holds the validation prompts); writes ``OUT/ckpt.pt``, ``OUT/log.jsonl`` and,
    at the end, the z-lab folder ``OUT/drafter``.

    ``init_from`` starts a new run from the weights of a z-lab drafter folder (its
    config replaces ``config``) instead of from the target's last layers. Every log
    record carries ``labels_seen``, the labelled draft slots trained on so far (summed
    over sittings and over runs chained with ``init_from``), the x-axis of the
    training curve."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = out / "ckpt.pt", out / "log.jsonl"
    dirs = [data_dir] if isinstance(data_dir, (str, Path)) else list(data_dir)
    data = load_sequences(*dirs)
    val = [chat_ids(tokenizer, json.loads(line)["text"])
           for line in (Path(dirs[0]) / "val_prompts.jsonl").read_text().splitlines() if line.strip()]
    if not val:
        raise ValueError(f"{dirs[0]}/val_prompts.jsonl is empty: list a folder built with --num-val > 0 first")
    torch.manual_seed(settings.seed)
    elapsed, labels_seen = 0.0, 0
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        drafter = DFlashDrafter(DFlashConfig.from_dict(state["config"])).to(torch.float32)
        trainer = Trainer(target, drafter, data, settings)
        trainer.load_state_dict(state)
        elapsed, labels_seen = float(state.get("elapsed", 0.0)), int(state.get("labels_seen", 0))
    else:
        if init_from is not None:
            drafter = DFlashDrafter.from_pretrained(init_from, dtype=torch.float32).train()
            sidecar = Path(init_from) / "training.json"  # written by `export`
            labels_seen = int(json.loads(sidecar.read_text())["labels_seen"]) if sidecar.exists() else 0
        else:
            drafter = DFlashDrafter(config).to(torch.float32)
            if settings.init_from_target:
                init_from_target(drafter, target)
        trainer = Trainer(target, drafter, data, settings)
        log_path.write_text("")
        tau0 = validation_tau(target, drafter, val[: settings.val_prompts], settings.val_max_new_tokens)
        _log(log_path, {"step": 0, "val_tau": tau0, "labels_seen": labels_seen})
    budget = None if settings.minutes is None else settings.minutes * 60
    bar = tqdm(total=settings.total_steps, initial=trainer.step_count, desc="fit", unit="step")
    start = time.time() - elapsed

    def save() -> None:
        _save_atomic({**trainer.state_dict(), "elapsed": time.time() - start, "labels_seen": labels_seen},
                     ckpt_path)

    while trainer.step_count < settings.total_steps and (budget is None or time.time() - start < budget):
        rec = trainer.step(0.0 if budget is None else (time.time() - start) / budget)
        labels_seen += rec.pop("labels")
        rec["labels_seen"] = labels_seen
        rec["elapsed"] = round(time.time() - start, 1)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", acc1=f"{rec['acc'][0]:.2f}")
        if trainer.step_count % settings.eval_every == 0:
            rec["val_tau"] = validation_tau(target, drafter, val[: settings.val_prompts],
                                            settings.val_max_new_tokens)
            tqdm.write(f"step {trainer.step_count}: val tau {rec['val_tau']:.3f}")
        _log(log_path, rec)
        if trainer.step_count % settings.save_every == 0:
            save()
    bar.close()
    save()
    final = validation_tau(target, drafter, val, settings.val_max_new_tokens)
    _log(log_path, {"step": trainer.step_count, "final_val_tau": final, "num_val_prompts": len(val),
                    "elapsed": round(time.time() - start, 1), "labels_seen": labels_seen})
    tqdm.write(f"final val tau over {len(val)} prompts: {final:.3f}")
    drafter.save_pretrained(out / "drafter")
    return out


def _log(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


def export(ckpt: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the z-lab folder (``config.json`` + ``model.safetensors``) of a checkpoint,
    plus ``training.json`` (steps, labelled slots seen, training settings) so a later run
    can continue from it (`fit` with ``init_from``) and keep counting."""
    state = torch.load(ckpt, weights_only=False, map_location="cpu")
    config = DFlashConfig.from_dict(state["config"])
    drafter = DFlashDrafter(config).to(state["drafter"]["fc.weight"].dtype)  # load at full precision
    drafter.load_state_dict(state["drafter"])
    drafter = drafter.to(dtype)
    drafter.save_pretrained(out)
    info = {"step": int(state["step"]), "labels_seen": int(state.get("labels_seen", 0)),
            "elapsed_s": round(float(state.get("elapsed", 0.0)), 1), "settings": state.get("settings")}
    (Path(out) / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return Path(out)


def training_curve(log: str | Path, out_dir: str | Path, title: str = "") -> dict[str, Any]:
    """The validation curve of a `fit` log: ``curve.json`` (every validation: step,
    labelled slots seen, elapsed seconds, val tau; the final all-prompts tau) and
    ``curve.png`` (val tau against labelled slots seen) in ``out_dir``."""
    recs = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    points = [{k: r[k] for k in ("step", "labels_seen", "elapsed", "val_tau") if k in r}
              for r in recs if "val_tau" in r]
    final = next((r for r in reversed(recs) if "final_val_tau" in r), None)
    losses = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    curve = {"title": title, "points": points, "final": final,
             "loss_by_100_steps": [[s, sum(v for _, v in chunk) / len(chunk)] for s, chunk in
                                   ((c[-1][0], c) for c in (losses[i: i + 100] for i in range(0, len(losses), 100)))]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(curve, indent=1) + "\n")

    def draw(ax) -> None:
        ax.plot([p.get("labels_seen", 0) / 1e6 for p in points], [p["val_tau"] for p in points], marker="o",
                label="val tau (held-out prompts, subset)")
        if final is not None:
            ax.scatter([final.get("labels_seen", 0) / 1e6], [final["final_val_tau"]], color="C3", zorder=3,
                       label=f"final, all {final.get('num_val_prompts', '?')} prompts")

    save_tau_figure(out / "curve.png", draw, xlabel="labelled draft slots trained on (millions)",
                    title=title or "drafter validation")
    return curve

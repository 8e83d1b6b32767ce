"""Drafter training loop: `Trainer` (one optimizer step at a time), `fit`, `export`.

One step draws ``batch_seqs`` sequences (the data cursor, `sampler.GroupSampler`: by
prompt group with the recipe's mix, each group in epoch permutations) and
``anchors_per_seq`` anchors in each (below ``max_offset`` in the response: where a
decode of that length draws them), projects the cached target features into context
K/V, runs every block of the batch in one drafter forward under `block_mask`, and
applies `dflash_loss` (over the draft vocabulary's top ``draft_vocab`` tokens when set).
Only the drafter trains: the target's embeddings and ``lm_head`` are frozen and
borrowed. AdamW, linear warmup then cosine decay to 10 % over ``total_steps`` (the
schedule is in steps only: a sitting's wall-clock stop ``minutes`` never bends it),
grad-norm clip 1.

`fit` wraps it with a tqdm bar, a JSON-lines log, atomic checkpoints (``OUT/ckpt.pt``:
fp32 drafter, optimizer, step, data cursor, elapsed time, labels seen; every
``save_every`` steps and every ``save_minutes``) and validation: teacher-forced block
acceptance over held-out anchors with its standard error (`acceptance.py`; a
``val_data`` folder), and optionally the generation tau of ``val_prompts`` held-out
prompts (``SpeculativeGenerator.generate(method="dflash")`` at T=0).
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
from ..drafter.draft_vocab import DraftVocabHead, save_draft_vocab
from ..drafter.domino import DominoDrafter
from ..drafter.dspark import DSparkDrafter
from ..drafter.families import drafter_class
from .curve import training_curve
from .data import Sequences, chat_ids, load_sequences
from .heads import head_parameters, teacher_forced_bias, teacher_forced_prev
from .loss import IGNORE, block_inputs, block_labels, block_mask, dflash_loss, sample_anchors, vocab_rows
from .sampler import GroupSampler
from .selection import group_folders
from .validate import Validator

__all__ = ["TrainSettings", "Trainer", "export", "fit", "init_from_target", "training_curve", "validation_tau"]


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 6e-4
    warmup_steps: int = 50
    total_steps: int = 2000  # length of the cosine schedule, and the stop
    minutes: float | None = None  # wall-clock stop of this sitting (the schedule stays in steps)
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
    max_offset: int | None = None  # anchors at response positions < max_offset (None: anywhere)
    draft_vocab: int | None = None  # cross-entropy over the ranking's top K tokens (None: the full head)
    mix: tuple[tuple[str, float], ...] | None = None  # (group, weight) draws (None: uniform over sequences)
    save_minutes: float = 10.0  # also checkpoint when this long has passed since the last one
    snapshot_every: int = 0  # keep OUT/ckpt_step{N}.pt every N steps (0: never)
    val_anchors: int = 8  # teacher-forced validation: anchors per held-out sequence
    val_max_offset: int | None = 95  # ... drawn below this response position (a 96-token decode)
    reload_every: int = 0  # every N steps, pick up shards written since (a data build still running)
    stop_at: int | None = None  # end this sitting at this step (the schedule stays over total_steps)
    head_only: bool = False  # train only a family head (DSpark's Markov head, Domino's GRU); the backbone is frozen


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
                 settings: TrainSettings, groups: list[str] | None = None) -> None:
        """``groups``: the prompt group of each sequence of ``data`` (needed with
        ``settings.mix``). With ``settings.draft_vocab`` the drafter must carry a
        ``vocab_ranking`` (a folder with ``draft_vocab.safetensors``)."""
        self.target, self.drafter, self.data, self.settings = target.eval(), drafter, data, settings
        for p in target.parameters():
            p.requires_grad_(False)
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.head, self.head_ids, self.label_map = self.lm_head, None, None
        if settings.draft_vocab is not None:
            ranking = drafter.vocab_ranking
            if ranking is None or ranking.numel() < settings.draft_vocab:
                raise ValueError(f"draft_vocab={settings.draft_vocab} needs a drafter vocab_ranking of at least "
                                 f"that many tokens (got {None if ranking is None else ranking.numel()}); "
                                 "start from a folder with draft_vocab.safetensors (`train draft-vocab`)")
            self.head_ids = ranking[: settings.draft_vocab].long()
            self.head = DraftVocabHead(self.lm_head, self.head_ids)
            self.label_map = vocab_rows(self.head_ids, self.lm_head.weight.shape[0])
        if settings.mix is not None and groups is None:
            raise ValueError("TrainSettings.mix needs the group of every sequence (Trainer(groups=...))")
        if groups is not None and len(groups) != len(data):
            raise ValueError(f"groups has {len(groups)} entries for {len(data)} sequences")
        self.sampler = GroupSampler(groups or ["all"] * len(data), None if settings.mix is None
                                    else dict(settings.mix), settings.seed)
        if isinstance(drafter, DSparkDrafter) and drafter.dspark.sample_from_anchor:
            raise ValueError("training a DSpark drafter needs sample_from_anchor = false (DFlash's query layout, "
                             "slot k predicts x[a + k]); `train add-head` writes one")
        if isinstance(drafter, DominoDrafter) and drafter.domino.shift_label:
            raise ValueError("training a Domino drafter needs shift_label = false (DFlash's query layout, "
                             "slot k predicts x[a + k]); `train add-head --family domino` writes one")
        if settings.head_only:
            trained = head_parameters(drafter)
            for p in drafter.parameters():
                p.requires_grad_(False)
            for p in trained:
                p.requires_grad_(True)
        self.trained = [p for p in drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.trained, lr=settings.lr, betas=(0.9, 0.95),
                                     weight_decay=settings.weight_decay, fused=True)
        self.step_count = 0

    def set_data(self, data: Sequences, groups: list[str] | None = None) -> None:
        """Train on ``data`` from now on (e.g. with shards added by a running build); the
        data cursor keeps each group's draw count (`GroupSampler.load_state_dict`)."""
        cursor = self.sampler.state_dict()
        self.data = data
        self.sampler = GroupSampler(groups or ["all"] * len(data), None if self.settings.mix is None
                                    else dict(self.settings.mix), self.settings.seed)
        self.sampler.load_state_dict(cursor)

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine to 10 % by ``total_steps``: a function of the step
        only, so a run resumed over many sittings follows one schedule."""
        s = self.settings
        if step < s.warmup_steps:
            return s.lr * (step + 1) / s.warmup_steps
        t = min(1.0, (step - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps))
        return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    def batch(self, step: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The batch of ``step``: ids ``[bs, T]``, features ``[bs, T, K*H]`` (float32),
        seq_lens ``[bs]``, anchors ``[bs, N]``. The sequences come from the data cursor
        (which this advances), the anchors from a generator seeded by ``(seed, step)``."""
        g = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + step)
        ids, feats, lens, plens = self.data.batch(self.sampler.draw(step, self.settings.batch_seqs))
        anchors = sample_anchors(plens, lens, self.settings.anchors_per_seq, g, max_offset=self.settings.max_offset)
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
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.settings.head_only):
            hidden = d(q_emb, q_pos, context, block_mask(anchors, width, d.block_size))
        labels = block_labels(ids, anchors, lens, d.block_size)
        n = d.block_size - 1  # a family head's bias, teacher-forced, over the rows the loss scores
        slots = hidden.view(bs, -1, d.block_size, hidden.shape[-1])[:, :, 1:].reshape(-1, n, hidden.shape[-1])
        prev = teacher_forced_prev(q_ids.view(bs, -1, d.block_size)[:, :, 0], labels).reshape(-1, n)
        bias = teacher_forced_bias(d, self.embed, slots, prev, self.head_ids)
        bias = None if bias is None else bias.view(*labels.shape, -1)
        return dflash_loss(hidden, labels, self.head, self.settings.gamma, self.settings.chunk_tokens,
                           sample_slots=slot_generator, label_map=self.label_map, bias=bias)

    def _autocast(self) -> torch.autocast:
        dev = self.drafter.fc.weight.device.type
        return torch.autocast(dev, dtype=torch.bfloat16, enabled=self.settings.autocast)

    def step(self) -> dict[str, Any]:
        """One optimizer step; returns ``{"step", "loss", "lr", "acc", "labels"}`` (acc
        per slot over the slots scored; labels: labelled slots of the batch)."""
        self.drafter.train()
        lr = self.lr_at(self.step_count)
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
        torch.nn.utils.clip_grad_norm_(self.trained, self.settings.clip)
        self.opt.step()
        self.step_count += 1
        labelled = int((block_labels(ids, anchors, lens, self.drafter.block_size) != IGNORE).sum())
        return {"step": self.step_count, "loss": float(loss.detach()), "lr": lr, "acc": acc.tolist(),
                "labels": labelled}

    def state_dict(self) -> dict[str, Any]:
        ranking = self.drafter.vocab_ranking
        return {"drafter": self.drafter.state_dict(), "optimizer": self.opt.state_dict(),
                "step": self.step_count, "config": self.drafter.config_dict(),  # config.json: the family's too
                "settings": dataclasses.asdict(self.settings), "cursor": self.sampler.state_dict(),
                "vocab_ranking": None if ranking is None else ranking.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.opt.load_state_dict(state["optimizer"])
        self.step_count = int(state["step"])
        if state.get("cursor") is not None:
            self.sampler.load_state_dict(state["cursor"])


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
        resume: bool = False, init_from: str | Path | None = None, val_data: str | Path | None = None) -> Path:
    """Train (or, with ``resume``, continue) a drafter on one or more data folders;
    writes ``OUT/ckpt.pt``, ``OUT/log.jsonl`` and, at the end, the z-lab folder
    ``OUT/drafter``.

    Validation (at step 0, every ``eval_every`` steps and at the end): the
    teacher-forced acceptance over ``val_data`` (a folder of held-out sequences) when
    given, and the generation tau of the first ``val_prompts`` prompts of the first
    data folder's ``val_prompts.jsonl`` when ``val_prompts > 0`` (all of them at the
    end). ``init_from`` starts a new run from the weights (and draft vocabulary) of a
    z-lab drafter folder (its config replaces ``config``) instead of from the target's
    last layers. Every log record carries ``labels_seen``, the labelled draft slots
    trained on so far (summed over sittings and over runs chained with ``init_from``),
    the x-axis of the training curve."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = out / "ckpt.pt", out / "log.jsonl"
    dirs = [data_dir] if isinstance(data_dir, (str, Path)) else list(data_dir)
    data, groups, shards = _load_folders(dirs, settings)
    val: list[list[int]] = []
    if settings.val_prompts > 0:
        val_file = Path(dirs[0]) / "val_prompts.jsonl"
        val = [chat_ids(tokenizer, json.loads(line)["text"])
               for line in (val_file.read_text().splitlines() if val_file.exists() else []) if line.strip()]
        if not val:
            raise ValueError(f"{val_file} has no prompts: build the first folder with --num-val > 0, or set "
                             "val_prompts=0 (--val-prompts 0) and validate with val_data")
    validator = Validator(val_data, settings) if val_data is not None else None

    def validate(trainer: Trainer, prompts: list[list[int]]) -> dict[str, Any]:
        rec: dict[str, Any] = validator(trainer) if validator is not None else {}
        if prompts:
            rec["val_tau"] = validation_tau(target, trainer.drafter, prompts, settings.val_max_new_tokens)
        return rec

    torch.manual_seed(settings.seed)
    elapsed, labels_seen = 0.0, 0
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        drafter = drafter_from_config(state["config"]).to(torch.float32)
        drafter.vocab_ranking = state.get("vocab_ranking")
        trainer = Trainer(target, drafter, data, settings, groups)
        trainer.load_state_dict(state)
        elapsed, labels_seen = float(state.get("elapsed", 0.0)), int(state.get("labels_seen", 0))
        tqdm.write(f"resumed {ckpt_path} at step {trainer.step_count} (cursor {state.get('cursor')})")
    else:
        if init_from is not None:
            drafter = DFlashDrafter.from_pretrained(init_from, dtype=torch.float32).train()
            sidecar = Path(init_from) / "training.json"  # written by `export`
            labels_seen = int(json.loads(sidecar.read_text())["labels_seen"]) if sidecar.exists() else 0
        else:
            drafter = DFlashDrafter(config).to(torch.float32)
            if settings.init_from_target:
                init_from_target(drafter, target)
        trainer = Trainer(target, drafter, data, settings, groups)
        log_path.write_text("")
        _log(log_path, {"step": 0, "labels_seen": labels_seen, "sequences": len(data), "shards": shards,
                        "folders": [str(d) for d in dirs], **validate(trainer, val[: settings.val_prompts])})
    bar = tqdm(total=settings.total_steps, initial=trainer.step_count, desc="fit", unit="step")
    start = time.time() - elapsed
    sitting_start = time.time()
    last_save = time.time()

    def save(path: Path = ckpt_path) -> None:
        _save_atomic({**trainer.state_dict(), "elapsed": time.time() - start, "labels_seen": labels_seen,
                      "data": {"folders": [str(d) for d in dirs], "sequences": len(data)}}, path)

    end = settings.total_steps if settings.stop_at is None else min(settings.stop_at, settings.total_steps)
    while trainer.step_count < end and (
            settings.minutes is None or time.time() - sitting_start < settings.minutes * 60):
        rec = trainer.step()
        labels_seen += rec.pop("labels")
        rec["labels_seen"] = labels_seen
        rec["elapsed"] = round(time.time() - start, 1)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", acc1=f"{rec['acc'][0]:.2f}")
        if trainer.step_count % settings.eval_every == 0:
            rec.update(validate(trainer, val[: settings.val_prompts]))
            rec["epochs"] = {g: round(e, 3) for g, e in trainer.sampler.epochs().items()}
            if "val_accept" in rec:
                tqdm.write(f"step {trainer.step_count}: teacher-forced acceptance {rec['val_accept']:.4f} "
                           f"+- {rec['val_accept_se']:.4f} ({rec['val_anchors']} anchors)")
        _log(log_path, rec)
        if trainer.step_count % settings.save_every == 0 or time.time() - last_save >= settings.save_minutes * 60:
            save()
            last_save = time.time()
        if settings.snapshot_every and trainer.step_count % settings.snapshot_every == 0:
            save(out / f"ckpt_step{trainer.step_count}.pt")
        if settings.reload_every and trainer.step_count % settings.reload_every == 0 and \
                _shard_count(dirs) != shards:
            data, groups, shards = _load_folders(dirs, settings)
            trainer.set_data(data, groups)
            _log(log_path, {"step": trainer.step_count, "reloaded": len(data), "shards": shards,
                            "labels_seen": labels_seen})
            tqdm.write(f"step {trainer.step_count}: data reloaded, {len(data)} sequences in {shards} shards")
    bar.close()
    save()
    if trainer.step_count < settings.total_steps:  # a sitting's stop: no final validation yet
        tqdm.write(f"stopped at step {trainer.step_count} of {settings.total_steps}; resume with --resume")
        return out
    final = validate(trainer, val)
    _log(log_path, {"step": trainer.step_count, "final": True, **{f"final_{k}": v for k, v in final.items()},
                    **({"final_val_tau": final["val_tau"], "num_val_prompts": len(val)} if val else {}),
                    "elapsed": round(time.time() - start, 1), "labels_seen": labels_seen})
    drafter.save_pretrained(out / "drafter")
    if drafter.vocab_ranking is not None:
        save_draft_vocab(out / "drafter", drafter.vocab_ranking)
    return out


def drafter_from_config(raw: dict[str, Any]) -> DFlashDrafter:
    """A fresh drafter of the family a checkpoint's ``config.json`` dict describes (a DFlash
    config dict, as runs before family heads stored, loads as DFlash)."""
    return drafter_class(raw)._from_raw(raw)


def _shard_count(dirs: Sequence[str | Path]) -> int:
    return sum(1 for d in dirs for _ in Path(d).glob("shard_*.safetensors"))


def _load_folders(dirs: Sequence[str | Path], settings: TrainSettings) -> tuple[Sequences, list[str] | None, int]:
    """The sequences (and, with a mix, their groups) of the folders, and the shard count.
    With ``reload_every`` a folder without shards yet (a build still to come) is skipped
    until it has some; without, every folder must have shards."""
    ready = [d for d in dirs if any(Path(d).glob("shard_*.safetensors"))]
    if not settings.reload_every and len(ready) < len(dirs):
        missing = [str(d) for d in dirs if d not in ready]
        raise FileNotFoundError(f"data folders without shards: {missing} (run the `data` command first, or set "
                                "--reload-every to pick them up while they are built)")
    data = load_sequences(*ready)
    return data, group_folders(ready) if settings.mix is not None else None, _shard_count(ready)


def _log(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


def export(ckpt: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the z-lab folder (``config.json`` + ``model.safetensors``, and the draft
    vocabulary when the run carries one) of a checkpoint, plus ``training.json`` (steps,
    labelled slots seen, training settings, data cursor) so a later run can continue
    from it (`fit` with ``init_from``) and keep counting."""
    state = torch.load(ckpt, weights_only=False, map_location="cpu")
    drafter = drafter_from_config(state["config"]).to(state["drafter"]["fc.weight"].dtype)  # at full precision
    drafter.load_state_dict(state["drafter"])
    drafter = drafter.to(dtype)
    drafter.save_pretrained(out)
    if state.get("vocab_ranking") is not None:
        save_draft_vocab(out, state["vocab_ranking"])
    info = {"step": int(state["step"]), "labels_seen": int(state.get("labels_seen", 0)),
            "elapsed_s": round(float(state.get("elapsed", 0.0)), 1), "settings": state.get("settings"),
            "cursor": state.get("cursor"), "data": state.get("data")}
    (Path(out) / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return Path(out)

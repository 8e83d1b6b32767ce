"""The seam to SGLang (`sglang_reanchor.srt.seam`): every target exists in the installed SGLang,
every wrapper resolves, and what is missing or untested is refused by name."""

from __future__ import annotations

import inspect

import pytest
import sglang

from sglang_reanchor.srt import seam


def test_the_installed_sglang_is_the_tested_one_and_has_every_target():
    assert sglang.__version__ in seam.TESTED_SGLANG
    seam.check_version()
    seam.check_targets()


def test_every_hook_wraps_its_original():
    names = [h.name for h in seam.HOOKS]
    assert len(set(names)) == len(names) and len({h.target for h in seam.HOOKS}) == len(names)
    for hook in seam.HOOKS:
        impl = seam._impl(hook)
        assert callable(impl) and next(iter(inspect.signature(impl).parameters)) == "original", hook.name
        assert hook.when in ("load", "worker") and hook.sglang in seam.TESTED_SGLANG and hook.reason


def test_a_missing_target_is_named_at_start_up(monkeypatch):
    monkeypatch.setattr(seam, "PRIVATE_API", seam.PRIVATE_API + ("sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2._gone",))
    with pytest.raises(RuntimeError, match=r"lacks what the plugin hooks or calls: .*DFlashWorkerV2\._gone"):
        seam.check_targets()


def test_an_untested_version_is_refused_unless_allowed(caplog):
    with pytest.raises(RuntimeError, match=r"tested against SGLang 0\.5\.23, this is SGLang 9\.9"):
        seam.check_version("9.9", environ={})
    seam.check_version("9.9", environ={seam.ALLOW_UNTESTED_ENV: "1"})  # a warning, not an error
    assert "this is SGLang 9.9" in caplog.text

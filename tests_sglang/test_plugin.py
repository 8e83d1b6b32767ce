"""Registration and server arguments, each in a fresh process after SGLang loads its plugins."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest

from conftest import run_fresh

RESOLVE = """
    import json, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.model_override_base import resolved_view
    sa = prepare_server_args(sys.argv[1:] if len(sys.argv) > 1 else {argv!r})
    sa.resolve_once()
    v = resolved_view(sa)
    keys = ["speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "disable_overlap_schedule", "disable_cuda_graph",
            "attention_backend", "speculative_draft_attention_backend", "max_running_requests"]
    import os
    out = {{k: getattr(v, k) for k in keys}}
    out["env_config"] = os.environ.get("SGLANG_REANCHOR_CONFIG")  # what spawned schedulers would read
    print("RESULT" + json.dumps(out))
"""


def resolve(tiny_dirs, *extra: str, env: dict[str, str] | None = None):
    target, drafter = tiny_dirs
    argv = ["--model-path", str(target), "--speculative-algorithm", "REANCHOR",
            "--speculative-draft-model-path", str(drafter), "--device", "cpu", *extra]
    out = run_fresh(RESOLVE.format(argv=argv), env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[len("RESULT"):]), out
    return None, out


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("reanchor") == "sglang_reanchor.srt.plugin:register"


def test_registered_after_load_plugins_with_the_project_worker():
    out = run_fresh("""
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang_reanchor.srt import plugin
        algo = SpeculativeAlgorithm.from_string("reanchor")
        plugin.register()  # idempotent: a second call is a no-op
        assert SpeculativeAlgorithm.from_string("REANCHOR") is algo
        assert type(algo).__name__ == "ReAnchorSpecAlgo", type(algo)
        assert algo.is_dflash() and algo.is_dflash_family() and algo.supports_target_verify_for_draft()
        assert not algo.is_eagle() and not algo.is_ngram() and not algo.need_topk()
        assert algo.carries_draft_hidden_states() is False
        assert algo.get_platform_worker_cls() is None
        assert callable(algo.create_future_map)
        worker = algo.factory(None)
        from sglang_reanchor.srt.worker import ReAnchorWorker
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
        assert worker is ReAnchorWorker and issubclass(worker, DFlashWorkerV2)
        print("OK")
    """)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-4000:]


def test_server_args_resolve_with_nothing_else(tiny_dirs):
    got, out = resolve(tiny_dirs)
    assert got is not None, out.stderr[-4000:]
    # block 8, offsets (1,2,3): 4 rows x 8 = 32 draft queries + 3 extra rows; node budget 48
    assert got == {
        "speculative_algorithm": "REANCHOR", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 48, "disable_overlap_schedule": True, "disable_cuda_graph": True,
        "attention_backend": "reanchor_sdpa", "speculative_draft_attention_backend": "reanchor_sdpa",
        "max_running_requests": 48, "env_config": None,
    }
    assert "no CPU defaults ship with this drafter" in out.stderr  # the paper's tree on a CPU is said to be slow


def _with_shipped_defaults(tmp_path, drafter, config: dict, dtype: str = "float32"):
    """A copy of ``drafter`` whose device_defaults.json holds ``config`` for this machine and ``dtype``."""
    import shutil

    import torch

    from sglang_reanchor.engine.defaults import machine_key

    folder = tmp_path / "drafter"
    shutil.copytree(drafter, folder)
    key = machine_key(torch.device("cpu"), getattr(torch, dtype))
    entry = {"key": key, "config": config, "tokens_per_s": 9.7, "plain_tokens_per_s": 9.5}
    (folder / "device_defaults.json").write_text(json.dumps({"entries": [entry]}))
    return folder


def test_cpu_server_takes_the_drafter_folders_defaults_for_this_machine(tiny_dirs, tmp_path):
    target, drafter = tiny_dirs
    shipped = {"offsets": [1], "policy": "offset", "node_budget": 6, "max_depth": 3, "draft_vocab": 8,
               "verify_threshold": 0.3}
    folder = _with_shipped_defaults(tmp_path, drafter, shipped)
    dirs = (target, folder)
    got, out = resolve(dirs, "--dtype", "float32")
    assert got is not None, out.stderr[-4000:]
    assert got["speculative_num_draft_tokens"] == 1 + 2 * 8  # the window of offsets (1,): 1 + 2 rows x 8
    served = json.loads(got["env_config"])  # written for the scheduler processes
    assert {k: served[k] for k in shipped} == shipped
    assert "defaults for this CPU" in out.stderr
    # another dtype is another machine kind: the paper's configuration, said so
    got, out = resolve(dirs, "--dtype", "bfloat16")
    assert got is not None and got["speculative_num_draft_tokens"] == 48 and got["env_config"] is None
    # TP 2 serves no draft vocabulary and no confidence cut: the shipped tree without them
    got, out = resolve(dirs, "--dtype", "float32", "--tp-size", "2")
    assert got is not None, out.stderr[-4000:]
    assert (json.loads(got["env_config"])["draft_vocab"], json.loads(got["env_config"])["verify_threshold"]) == (None, None)
    # the environment wins over anything shipped
    got, out = resolve(dirs, "--dtype", "float32", env={"SGLANG_REANCHOR_CONFIG": '{"node_budget": 64}'})
    assert got is not None and got["speculative_num_draft_tokens"] == 64


def test_config_from_env_sets_the_reservation(tiny_dirs):
    got, out = resolve(tiny_dirs, env={"SGLANG_REANCHOR_CONFIG": '{"offsets": [1, 2, 3, 4, 5, 6], "node_budget": 16}'})
    assert got is not None, out.stderr[-4000:]
    assert got["speculative_num_draft_tokens"] == 62  # the draft window: 6 + 7 * 8


def test_config_file(tiny_dirs, tmp_path):
    path = tmp_path / "reanchor.json"
    path.write_text('{"node_budget": 64}')
    got, out = resolve(tiny_dirs, env={"SGLANG_REANCHOR_CONFIG": str(path)})
    assert got is not None and got["speculative_num_draft_tokens"] == 64, out.stderr[-4000:]


def test_bad_config_names_the_field(tiny_dirs):
    got, out = resolve(tiny_dirs, env={"SGLANG_REANCHOR_CONFIG": '{"policy": "latest"}'})
    assert got is None and "ReAnchorConfig.policy" in out.stderr


def test_incompatible_arguments_fail_clearly(tiny_dirs):
    for extra, needle in (
        (["--attention-backend", "torch_native"], "does not apply a custom tree mask"),
        (["--page-size", "2"], "--page-size must be 1"),
        (["--speculative-num-draft-tokens", "8"], "is below the 48"),
    ):
        got, out = resolve(tiny_dirs, *extra)
        assert got is None and needle in out.stderr, (extra, out.stderr[-3000:])


def test_missing_draft_model_fails_clearly(tiny_dirs):
    target, _ = tiny_dirs
    out = run_fresh(RESOLVE.format(argv=["--model-path", str(target), "--speculative-algorithm", "REANCHOR",
                                         "--device", "cpu"]))
    assert out.returncode != 0 and "--speculative-draft-model-path is required" in out.stderr


ALLOCATION = """
    import json, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.runtime_context import publish
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode, get_req_to_token_extra_context_len
    sa = prepare_server_args({argv!r})
    sa.resolve_once()
    publish(sa, role="tokenizer")  # the config bags SGLang's allocation sizing reads
    print("RESULT" + json.dumps({{"per_step": get_alloc_len_per_decode(),
                                  "row_extra": get_req_to_token_extra_context_len()}}))
"""


@pytest.mark.parametrize("config,draft_columns,nodes", [
    (None, 3 + 4 * 8, 48),
    ('{"node_budget": 16}', 3 + 4 * 8, 16),
    ('{"offsets": [1, 2, 3, 4, 5, 6], "node_budget": 16}', 6 + 7 * 8, 16),
])
def test_sglang_allocates_per_step_what_a_round_writes(tiny_dirs, config, draft_columns, nodes):
    """SGLang's own sizing of the resolved server: one decode step's KV per request covers both windows."""
    target, drafter = tiny_dirs
    argv = ["--model-path", str(target), "--speculative-algorithm", "REANCHOR",
            "--speculative-draft-model-path", str(drafter), "--device", "cpu"]
    out = run_fresh(ALLOCATION.format(argv=argv), env={"SGLANG_REANCHOR_CONFIG": config or ""})
    rows = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert rows, out.stderr[-4000:]
    got = json.loads(rows[0][len("RESULT"):])
    assert got["per_step"] >= max(draft_columns, nodes)  # get_alloc_len_per_decode: SGLang's per-step promise
    assert got["row_extra"] >= max(draft_columns, nodes)  # req_to_token headroom past the context length

"""Root-alone REANCHOR rounds against plain SGLang with and without its overlap event loop, 16 clients.

Run from the repository root with the SGLang venv (TRITON_INTERPRET=1): ab_roots_c16.py OUT.json. Three servers
(plain SGLang; plain SGLang with --disable-overlap-schedule, the event loop REANCHOR runs; REANCHOR with
batch_node_budget 1: every round a root alone, `ReAnchorWorker._decode_roots`), each measured twice in the
order A B C A B C, 64 requests of 32 greedy tokens from 16 closed-loop clients per measurement."""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts"); sys.path.insert(0, "tests_sglang")
from load_bench import run_level
from http_server import launch
from sglang_reanchor.hub import default_target_path, shipped_drafter_path

ARGS = ["--dtype", "bfloat16", "--max-total-tokens", "16384", "--max-running-requests", "16", "--mem-fraction-static", "0.5"]
SERVERS = {"plain": (None, None, []), "plain-no-overlap": (None, None, ["--disable-overlap-schedule"]),
           "reanchor-roots": ("REANCHOR", '{"offsets":[],"max_depth":6,"draft_vocab":8192,"batch_node_budget":1}', [])}
out: dict[str, list[float]] = {k: [] for k in SERVERS}
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    (root / "target").symlink_to(Path(default_target_path()).resolve())
    (root / "drafter").symlink_to(Path(shipped_drafter_path()).resolve())
    for rep in range(2):
        for name, (algo, config, extra) in SERVERS.items():
            with launch(root, algo, config, extra_args=ARGS + extra, timeout=1200) as url:
                run_level(url, 4, 8, 8)  # warm-up
                out[name].append(run_level(url, 16, 64, 32)["tokens_per_s"])
                print(name, rep, f"{out[name][-1]:.1f} tok/s", flush=True)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")
for name, v in out.items():
    print(f"{name:18s} {' '.join(f'{x:.1f}' for x in v)}  mean {sum(v) / len(v):.1f}  ({sum(v) / sum(out['plain']):.2f}x plain)")

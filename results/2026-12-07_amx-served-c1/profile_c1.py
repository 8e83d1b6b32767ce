"""py-spy on the scheduler of plain SGLang (its default overlap loop) and of REANCHOR with nothing set (the served
defaults of this CPU kind: the shipped cost profile and tree), one client, bfloat16: where a served round's time goes.
Run from the repository root with the SGLang venv (TRITON_INTERPRET=1): profile_c1.py PY_SPY OUT_DIR [NAME...].
Writes OUT_DIR/profile_NAME.txt (py-spy's raw stacks) and prints, per server, tokens/s while sampled and the share of
the samples under each step of the worker (the ReAnchorWorker frame below ``_decode``), split into the target's or
the drafter's model forward and the rest."""
import collections, subprocess, sys, tempfile, threading
from pathlib import Path
sys.path.insert(0, "scripts"); sys.path.insert(0, "tests_sglang")
from load_bench import run_level
from http_server import launch
from sglang_reanchor.hub import default_target_path, shipped_drafter_path

spy, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
args = ["--dtype", "bfloat16", "--max-total-tokens", "16384", "--max-running-requests", "16", "--mem-fraction-static", "0.5"]
servers = {"plain": (None, None), "reanchor": ("REANCHOR", None),
           "chain": ("REANCHOR", '{"offsets":[],"max_depth":6,"draft_vocab":8192}')}
names = sys.argv[3:] or list(servers)


def summary(raw: Path) -> None:
    counts: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        k = int(n); total += k
        frames = [f.split(" (")[0] for f in stack.split(";")]
        ours = [f for f in frames if f.startswith("ReAnchorWorker.")]
        step = ours[1] if len(ours) > 1 else (ours[0] if ours else "-")
        if any(f.endswith("ForCausalLM.forward") for f in frames):
            where = "target forward"
        elif any(f.startswith(("DFlashDraftModel.forward", "DFlashDraftModel")) for f in frames):
            where = "drafter forward"
        elif "ModelRunner.forward" in frames:
            where = "ModelRunner.forward, outside the model"
        else:
            where = ";".join(f for f in frames[-2:])
        counts[f"{step} | {where}"] += k
    print(f"  samples {total}")
    for key, k in counts.most_common(30):
        print(f"    {100 * k / total:5.1f} %  {key}")


with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    (root / "target").symlink_to(Path(default_target_path()).resolve())
    (root / "drafter").symlink_to(Path(shipped_drafter_path()).resolve())
    for name in names:
        algorithm, cfg = servers[name]
        with launch(root, algorithm, cfg, extra_args=args, timeout=1200) as url:
            run_level(url, 1, 4, 32)
            pid = subprocess.run(["pgrep", "-f", "sglang::scheduler"], capture_output=True, text=True).stdout.split()[0]
            raw = out / f"profile_{name}.txt"
            rec = subprocess.Popen([spy, "record", "--pid", pid, "--duration", "40", "--rate", "200", "--format", "raw",
                                    "--output", str(raw), "--nonblocking"])
            level: dict = {}
            t = threading.Thread(target=lambda: level.update(run_level(url, 1, 40, 32)), daemon=True)
            t.start(); rec.wait(); t.join()
        print(f"{name}: {level['tokens_per_s']:.1f} tokens/s at 1 client (40 requests x 32 tokens)")
        summary(raw)

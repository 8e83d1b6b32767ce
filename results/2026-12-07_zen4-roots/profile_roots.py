"""py-spy on the scheduler of plain SGLang in its synchronous loop (plain-sync) and of REANCHOR verifying the root
alone every round (the Zen 4 entry with batch_node_budget 1), bfloat16, at CLIENTS closed-loop clients: where a
root-alone round's time goes besides the target's forward. Run from the repository root with the SGLang venv
(TRITON_INTERPRET=1): profile_roots.py PY_SPY OUT_DIR [CLIENTS]. Writes OUT_DIR/profile_roots_{plain,reanchor}_cC.txt
(py-spy's raw stacks) and prints per server tokens/s while sampled, the share of samples inside the target model's
forward, and the largest frames outside it grouped by the worker step they are under."""
import collections, subprocess, sys, tempfile, threading
from pathlib import Path
sys.path.insert(0, "scripts"); sys.path.insert(0, "tests_sglang")
from load_bench import run_level
from http_server import launch
from sglang_reanchor.hub import default_target_path, shipped_drafter_path

spy, out = sys.argv[1], Path(sys.argv[2])
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 8
requests = 24 * clients
config = ('{"offsets":[1],"node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3,'
          '"batch_node_budget":1}')
args = ["--dtype", "bfloat16", "--max-total-tokens", "16384", "--max-running-requests", "16", "--mem-fraction-static", "0.5"]
servers = {"plain": (None, None, ["--disable-overlap-schedule"]), "reanchor": ("REANCHOR", config, [])}


def summary(raw: Path) -> None:
    counts: collections.Counter = collections.Counter()
    total = model = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        k = int(n); total += k
        frames = [f.split(" (")[0] for f in stack.split(";")]
        if any(f.endswith("ForCausalLM.forward") for f in frames):
            model += k
            continue
        keep = [f for f in frames if not f.startswith(("<module>", "spawn_main", "_main", "BaseProcess"))]
        ours = [f for f in keep if f.startswith("ReAnchorWorker.")]
        counts[(ours[1] if len(ours) > 1 else (ours[0] if ours else "-")) + " | " + ";".join(keep[-2:])] += k
    print(f"  samples {total}: target forward {100 * model / total:.1f} %, the rest {100 * (total - model) / total:.1f} %")
    for stack, k in counts.most_common(25):
        print(f"    {100 * k / total:5.1f} %  {stack}")


with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    (root / "target").symlink_to(Path(default_target_path()).resolve())
    (root / "drafter").symlink_to(Path(shipped_drafter_path()).resolve())
    for name, (algorithm, cfg, extra) in servers.items():
        with launch(root, algorithm, cfg, extra_args=args + extra, timeout=1200) as url:
            run_level(url, 1, 4, 32)
            pid = subprocess.run(["pgrep", "-f", "sglang::scheduler"], capture_output=True, text=True).stdout.split()[0]
            raw = out / f"profile_roots_{name}_c{clients}.txt"
            rec = subprocess.Popen([spy, "record", "--pid", pid, "--duration", "40", "--rate", "200", "--format", "raw",
                                    "--output", str(raw), "--nonblocking"])
            level: dict = {}
            t = threading.Thread(target=lambda: level.update(run_level(url, clients, requests, 32)), daemon=True)
            t.start(); rec.wait(); t.join()
        print(f"{name}: {level['tokens_per_s']:.1f} tokens/s at {clients} client(s) ({requests} requests x 32 tokens)")
        summary(raw)

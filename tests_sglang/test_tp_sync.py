"""Two tensor-parallel ranks agree on the next round's anchors (CPU, gloo).

SGLang's TP on CPU needs the AMX CPU engine, so no server runs here. Instead two
processes form a real TP group (SGLang's `GroupCoordinator` over gloo) and each
runs the worker's real ``ReAnchorWorker._accept`` with a real ``SpecTpSync`` on
logits that differ between the ranks by a near-tie at a rejected node: the
predictions stored for the next round's shifted anchors must be rank 0's on both
ranks, greedy and sampled.
"""

from __future__ import annotations

import json
import socket

from conftest import run_fresh

RANK = """
    import json, sys
    import torch
    from sglang.srt.distributed import parallel_state as ps
    rank, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    group = ps.GroupCoordinator(  # SGLang's TP group object, gloo only
        group_ranks=[[0, 1]], local_rank=rank, torch_distributed_backend="gloo", use_pynccl=False,
        use_mscclpp=False, use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
        use_hpu_communicator=False, use_xpu_communicator=False, group_name="tp")
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync
    from sglang_reanchor.config import ReAnchorConfig
    from sglang_reanchor.round import RoundCore
    from sglang_reanchor.srt.worker import ReAnchorWorker
    from sglang_reanchor.tree import DraftTree

    worker = ReAnchorWorker.__new__(ReAnchorWorker)  # only _accept's state: no model is needed
    worker._tp_sync = SpecTpSync(group)
    worker._sample_rng = torch.Generator().manual_seed(0)
    worker.core = RoundCore(ReAnchorConfig(), num_drafts=3, device="cpu")  # the acceptance the worker calls

    vocab = 16
    tree = DraftTree.chain(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]))  # [2, 4]
    logits = torch.zeros(2, 4, vocab)
    logits[:, 0, 6] = 5.0   # after the root: 6, node 1 accepted
    logits[:, 1, 9] = 5.0   # after node 1: 9, node 2 (token 7) rejected; nodes 2, 3 form the suffix
    logits[:, 2, 10 + rank] = 5.0001  # the near-tie: each rank's argmax differs (10 on rank 0, 11 on rank 1)
    logits[:, 2, 11 - rank] = 5.0
    logits[:, 3, 12] = 5.0
    if mode == "greedy":
        info = None
    else:  # request 0 sampled (its top-1 is what the next round anchors at), request 1 greedy
        n = 2
        info = SamplingBatchInfo(
            temperatures=torch.tensor([[0.7], [1.0]]), top_ps=torch.ones(n), top_ks=torch.tensor([-1, 1]),
            min_ps=torch.zeros(n), is_all_greedy=False, is_any_greedy=True, need_top_p_sampling=False,
            need_top_k_sampling=True, need_min_p_sampling=False, vocab_size=vocab)
    acc = worker._accept(tree, logits, torch.arange(4).repeat(2, 1), info)
    print("RESULT" + json.dumps({"local_top1": int(logits[0, 2].argmax()),
                                 "lengths": acc.suffix_lengths.tolist(),
                                 "predictions": [p[:n] for p, n in zip(acc.suffix_predictions.tolist(),
                                                                       acc.suffix_lengths.tolist())],
                                 "bonus": acc.bonus.tolist()}))
    torch.distributed.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(mode: str) -> list[dict]:
    import subprocess
    import sys
    import textwrap

    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK), str(r), str(port), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        rows = [line for line in out.splitlines() if line.startswith("RESULT")]
        assert p.returncode == 0 and rows, err[-4000:]
        results.append(json.loads(rows[-1][len("RESULT"):]))
    return results


def test_ranks_store_the_synced_predictions_greedy():
    r0, r1 = run_ranks("greedy")
    assert (r0["local_top1"], r1["local_top1"]) == (10, 11)  # the ranks' own argmaxes disagree
    assert r0["lengths"] == r1["lengths"] == [2, 2]
    assert r0["predictions"] == r1["predictions"] == [[10, 12], [10, 12]]  # rank 0's, on both
    assert r0["bonus"] == r1["bonus"] == [9, 9]


def test_ranks_store_the_synced_predictions_sampled():
    r0, r1 = run_ranks("sampled")
    assert (r0["local_top1"], r1["local_top1"]) == (10, 11)
    assert r0["lengths"] == r1["lengths"]
    assert r0["predictions"] == r1["predictions"]
    assert r0["predictions"][1] == [10, 12]  # the greedy request: rank 0's argmax
    assert r0["bonus"] == r1["bonus"]

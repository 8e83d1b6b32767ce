"""Tree-verify attention backends (Triton and torch) against a float64 dense oracle; the plan step.

On a machine without CUDA the Triton kernels run under the interpreter: the
environment variable is set here, before anything imports triton (this file needs no
conftest). Triton tests skip when triton is not installed; torch-backend and
validation tests always run. Sizes are tiny because the interpreter is slow.
"""

from __future__ import annotations

import importlib.util
import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton`

import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402

import pytest  # noqa: E402

from attention import tree_attention  # noqa: E402
from attention.layout import TreeAttentionLayout, TreeAttentionSpec, plan_tree_attention  # noqa: E402
from attention.plan import TreeBatch, plan_tree_batch  # noqa: E402
from attention.reference import TorchTreeAttention  # noqa: E402
from attention.tree_attn import Backend, get_backend  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

TOL = {  # dtype -> (atol, rtol) against the float64 oracle
    torch.float32: (2e-5, 2e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 2e-2),
}


@dataclass(frozen=True)
class Problem:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [S, Hkv, D]
    v_cache: torch.Tensor  # [S, Hkv, D]
    kv_indptr: torch.Tensor  # [bs + 1]
    kv_indices: torch.Tensor  # [kv_indptr[-1]]
    qo_indptr: torch.Tensor  # [bs + 1]
    custom_mask: torch.Tensor  # [sum N_b * kv_len_b] bool

    def args(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.q, self.k_cache, self.v_cache, self.kv_indptr, self.kv_indices, self.qo_indptr, self.custom_mask)

    def layout(self, sm_scale: float | None = None) -> TreeAttentionLayout:
        return plan_tree_attention(TreeAttentionSpec(
            qo_indptr=self.qo_indptr, kv_indptr=self.kv_indptr, kv_indices=self.kv_indices,
            custom_mask=self.custom_mask, num_q_heads=self.q.shape[1], num_kv_heads=self.k_cache.shape[1],
            head_dim=self.q.shape[2], sm_scale=sm_scale))


def random_tree(n: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def make_problem(
    tree_sizes: list[int],
    prefix_lens: list[int],
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    random_mask: bool = False,
) -> Problem:
    """Random trees over scattered KV slots (a permutation of a cache with spare slots)."""
    gen = torch.Generator().manual_seed(seed)
    trees = [random_tree(n, gen) for n in tree_sizes]
    total = sum(prefix_lens) + sum(tree_sizes)
    num_slots = total + 7
    perm = torch.randperm(num_slots, generator=gen)[:total].tolist()
    slots, cursor = [], 0
    for n, p in zip(tree_sizes, prefix_lens, strict=True):
        slots.append(perm[cursor : cursor + p + n])
        cursor += p + n
    plan = plan_tree_batch(TreeBatch.from_lists(trees, prefix_lens, slots))
    mask = plan.custom_mask
    if random_mask:
        mask = torch.rand(mask.numel(), generator=gen) < 0.4
        mask[: prefix_lens[0] + tree_sizes[0]] = False  # first row of request 0 sees nothing
    q = torch.randn(sum(tree_sizes), num_q_heads, head_dim, generator=gen)
    k = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen)
    dev = DEVICE
    return Problem(
        q=q.to(dtype).to(dev),
        k_cache=k.to(dtype).to(dev),
        v_cache=v.to(dtype).to(dev),
        kv_indptr=plan.kv_indptr.to(dev),
        kv_indices=plan.kv_indices.to(dev),
        qo_indptr=plan.qo_indptr.to(dev),
        custom_mask=mask.to(dev),
    )


def oracle_f64(p: Problem, sm_scale: float | None = None) -> torch.Tensor:
    """Dense masked softmax in float64, one request and one head at a time."""
    q, k, v = p.q.double().cpu(), p.k_cache.double().cpu(), p.v_cache.double().cpu()
    qo, kv = p.qo_indptr.tolist(), p.kv_indptr.tolist()
    slots_all, mask_all = p.kv_indices.long().cpu(), p.custom_mask.cpu()
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k.shape[1]
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    out = torch.zeros_like(q)
    offset = 0
    for b in range(len(qo) - 1):
        n, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        slots = slots_all[kv[b] : kv[b + 1]]
        allowed = mask_all[offset : offset + n * kv_len].view(n, kv_len)
        offset += n * kv_len
        for h in range(num_q_heads):
            scores = q[qo[b] : qo[b + 1], h] @ k[slots, h // group].T * scale
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            probs = torch.where(allowed.any(dim=-1, keepdim=True), probs, 0.0)
            out[qo[b] : qo[b + 1], h] = probs @ v[slots, h // group]
    return out


def assert_close_to_oracle(got: torch.Tensor, p: Problem, sm_scale: float | None = None) -> None:
    assert got.dtype == p.q.dtype and got.shape == p.q.shape
    assert not torch.isnan(got).any(), "some output element was never written"
    atol, rtol = TOL[p.q.dtype]
    torch.testing.assert_close(got.double().cpu(), oracle_f64(p, sm_scale), atol=atol, rtol=rtol)


def run_triton(p: Problem, sm_scale: float | None = None, **kwargs: int) -> torch.Tensor:
    from attention.triton_tree import TritonTreeAttention

    out = torch.full_like(p.q, float("nan"))  # poison: every element must be written
    result = TritonTreeAttention(**kwargs).run(p.layout(sm_scale), p.q, p.k_cache, p.v_cache, out=out)
    assert result.data_ptr() == out.data_ptr()
    return result


def run_torch(p: Problem, sm_scale: float | None = None) -> torch.Tensor:
    return TorchTreeAttention().run(p.layout(sm_scale), p.q, p.k_cache, p.v_cache)


# ----------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("splits", [1, 3])
def test_triton_matches_float64_oracle(dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, splits: int) -> None:
    p = make_problem([5, 1, 8], [11, 0, 19], num_q_heads, num_kv_heads, dtype=dtype, seed=splits + num_q_heads)
    assert_close_to_oracle(run_triton(p, num_kv_splits=splits), p)


@needs_triton
@pytest.mark.parametrize("splits", [1, 4])
def test_triton_many_row_blocks_and_key_tiles(splits: int) -> None:
    # 20 nodes x group 2 = 40 rows -> 3 row blocks of 16; 50 + 20 keys -> 5 key tiles of 16.
    p = make_problem([20, 3], [50, 2], num_q_heads=4, num_kv_heads=2, seed=7)
    assert_close_to_oracle(run_triton(p, num_kv_splits=splits, block_m=16, block_n=16), p)


@needs_triton
@pytest.mark.parametrize("splits", [1, 2])
def test_triton_arbitrary_mask_with_empty_rows(splits: int) -> None:
    p = make_problem([6, 4], [9, 5], random_mask=True, seed=3)
    got = run_triton(p, num_kv_splits=splits)
    assert_close_to_oracle(got, p)
    assert torch.equal(got[0].cpu(), torch.zeros_like(got[0].cpu()))  # row with no visible key -> zeros


@needs_triton
def test_triton_head_dim_not_power_of_two_and_custom_scale() -> None:
    p = make_problem([7, 2], [4, 13], num_q_heads=2, num_kv_heads=1, head_dim=24, seed=5)
    assert_close_to_oracle(run_triton(p, sm_scale=0.3), p, sm_scale=0.3)


@needs_triton
def test_triton_single_node_no_prefix_and_int64_indices() -> None:
    p = make_problem([1, 3], [0, 1], seed=11)
    p = replace(p, kv_indptr=p.kv_indptr.long(), kv_indices=p.kv_indices.long(), qo_indptr=p.qo_indptr.long())
    assert_close_to_oracle(run_triton(p), p)


@needs_triton
def test_tree_attention_dispatches_to_triton_and_torch() -> None:
    p = make_problem([4, 3], [6, 2], seed=2)
    backends: tuple[Backend, ...] = ("triton", "torch", "auto")
    for backend in backends:
        assert_close_to_oracle(tree_attention(*p.args(), backend=backend), p)


# ----------------------------------------------------------------------------
# Torch backend
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (6, 2)])
def test_torch_backend_matches_float64_oracle(dtype: torch.dtype, num_q_heads: int, num_kv_heads: int) -> None:
    p = make_problem([5, 1, 9, 3], [12, 0, 30, 1], num_q_heads, num_kv_heads, dtype=dtype, seed=num_q_heads)
    assert_close_to_oracle(run_torch(p), p)
    assert_close_to_oracle(tree_attention(*p.args(), backend="torch"), p)


def test_torch_backend_arbitrary_mask_and_scale() -> None:
    p = make_problem([6, 4], [9, 5], random_mask=True, seed=4)
    assert_close_to_oracle(run_torch(p, sm_scale=2.0), p, sm_scale=2.0)


# ----------------------------------------------------------------------------
# Input validation at the public entry
# ----------------------------------------------------------------------------

Mutation = Callable[[Problem], Problem]

INVALID: list[tuple[str, Mutation, str]] = [
    ("q_ndim", lambda p: replace(p, q=p.q[:, 0]), "q must be a 3-D"),
    ("q_dtype", lambda p: replace(p, q=p.q.double()), "q must be float32"),
    ("kv_dtype", lambda p: replace(p, k_cache=p.k_cache.half()), "dtype"),
    ("head_dim", lambda p: replace(p, k_cache=p.k_cache[..., :8], v_cache=p.v_cache[..., :8]), "head_dim"),
    ("v_shape", lambda p: replace(p, v_cache=p.v_cache[:-1]), "v_cache shape"),
    ("gqa", lambda p: replace(p, q=p.q[:, :3]), "multiple"),
    ("qo_len", lambda p: replace(p, qo_indptr=p.qo_indptr[:-1]), "qo_indptr has"),
    ("qo_end", lambda p: replace(p, q=p.q[:-1]), r"qo_indptr\[-1\]"),
    ("qo_order", lambda p: replace(p, qo_indptr=p.qo_indptr.flip(0)), "qo_indptr must start at 0"),
    ("kv_dtype_idx", lambda p: replace(p, kv_indptr=p.kv_indptr.float()), "kv_indptr must be"),
    ("kv_short", lambda p: replace(p, kv_indices=p.kv_indices[:-1]), "kv_indptr"),
    ("kv_oob", lambda p: replace(p, kv_indices=p.kv_indices + 1000), "kv_indices must lie"),
    ("mask_len", lambda p: replace(p, custom_mask=p.custom_mask[:-1]), "custom_mask has"),
    ("mask_dtype", lambda p: replace(p, custom_mask=p.custom_mask.to(torch.uint8)), "custom_mask must be"),
]


@pytest.mark.parametrize(("mutate", "match"), [(m, r) for _, m, r in INVALID], ids=[n for n, _, _ in INVALID])
def test_invalid_inputs_raise_value_error_naming_argument(mutate: Mutation, match: str) -> None:
    bad = mutate(make_problem([3, 2], [4, 1]))
    with pytest.raises(ValueError, match=match):
        tree_attention(*bad.args(), backend="torch")


# ----------------------------------------------------------------------------
# Plan once, run per layer
# ----------------------------------------------------------------------------


def all_backends() -> list[str]:
    return ["torch", "triton"] if HAS_TRITON else ["torch"]


@pytest.mark.parametrize("backend", all_backends())
def test_one_layout_serves_every_layer_without_a_host_sync(backend: str) -> None:
    """Three "layers" (fresh q / K / V each) run on one layout, and none would block a GPU's host.

    The Triton interpreter copies every tensor to the host by design, so the sync check of the
    Triton backend runs on CUDA only; on CPU its results are still checked.
    """
    from sglang_reanchor.audit import SyncDetector

    base = make_problem([5, 2, 7], [9, 0, 4], seed=21)
    layout = base.layout()
    impl = get_backend(backend, DEVICE)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(5)
    layers = [replace(base, q=torch.randn(base.q.shape, generator=gen).to(DEVICE),
                      k_cache=torch.randn(base.k_cache.shape, generator=gen).to(DEVICE),
                      v_cache=torch.randn(base.v_cache.shape, generator=gen).to(DEVICE)) for _ in range(3)]
    impl.run(layout, base.q, base.k_cache, base.v_cache)  # warm-up: Triton compiles outside the region
    with SyncDetector() as sync:
        outs = [impl.run(layout, p.q, p.k_cache, p.v_cache) for p in layers]
    if backend == "torch" or DEVICE == "cuda":
        assert sync.hits == [], [str(h) for h in sync.hits]
    for p, got in zip(layers, outs, strict=True):
        assert_close_to_oracle(got, p)
    with SyncDetector() as planning:  # the detector sees the plan step's host reads: the check above can fail
        base.layout()
    assert any(h.op == "Tensor.tolist" for h in planning.hits)


def test_plan_reads_host_facts_once() -> None:
    p = make_problem([3, 1, 4], [2, 5, 0], seed=8)
    layout = p.layout(sm_scale=0.5)
    assert layout.qo_lens == (3, 1, 4) and layout.kv_lens == (5, 6, 4) and layout.sm_scale == 0.5
    assert layout.mask_indptr.tolist() == [0, 15, 21, 37]
    assert layout.min_slots == int(p.kv_indices.max()) + 1 and layout.group_size == 2
    assert p.layout().sm_scale == pytest.approx(16**-0.5)


def test_run_refuses_tensors_that_do_not_match_the_plan() -> None:
    p = make_problem([3, 2], [4, 1])
    layout = p.layout()
    torch_backend = TorchTreeAttention()
    with pytest.raises(ValueError, match="as planned"):
        torch_backend.run(layout, p.q[:, :2], p.k_cache, p.v_cache)
    with pytest.raises(ValueError, match="planned for 2"):
        torch_backend.run(layout, p.q, p.k_cache[:, :1], p.v_cache[:, :1])
    with pytest.raises(ValueError, match="kv_indices must lie"):
        torch_backend.run(layout, p.q, p.k_cache[: layout.min_slots - 1], p.v_cache[: layout.min_slots - 1])
    with pytest.raises(ValueError, match="out must match"):
        torch_backend.run(layout, p.q, p.k_cache, p.v_cache, out=p.q[:-1])
    with pytest.raises(ValueError, match="TreeAttentionSpec"):
        plan_tree_attention(p.args())  # type: ignore[arg-type]
    bad = TreeAttentionSpec(qo_indptr=p.qo_indptr, kv_indptr=p.kv_indptr, kv_indices=p.kv_indices - 100,
                            custom_mask=p.custom_mask, num_q_heads=4, num_kv_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="kv_indices must lie"):
        plan_tree_attention(bad)


def test_plan_from_a_tree_plan_equals_the_spec_of_its_arrays() -> None:
    tree = plan_tree_batch(TreeBatch.from_lists([[-1, 0, 0, 1], [-1, 0]], [2, 1]))
    layout = plan_tree_attention(TreeAttentionSpec.from_tree_plan(tree, 4, 2, 16))
    assert torch.equal(layout.custom_mask, tree.custom_mask) and layout.qo_lens == (4, 2)
    assert layout.kv_lens == (6, 3) and layout.min_slots == 9


def test_invalid_backend_raises() -> None:
    p = make_problem([2], [1])
    with pytest.raises(ValueError, match="backend"):
        tree_attention(*p.args(), backend="cuda")  # type: ignore[arg-type]


def test_package_imports_without_triton_or_flashinfer() -> None:
    code = (
        "import sys; sys.modules['triton'] = None; sys.modules['flashinfer'] = None\n"
        "import torch, attention\n"
        "from attention import tree_attention\n"
        "q = torch.randn(2, 2, 16); k = torch.randn(3, 1, 16)\n"
        "i = torch.tensor([0, 2]); kv = torch.tensor([0, 3]); s = torch.tensor([0, 1, 2])\n"
        "out = tree_attention(q, k, k, kv, s, i, torch.ones(6, dtype=torch.bool))\n"
        "assert out.shape == q.shape\n"
        "try:\n"
        "    tree_attention(q, k, k, kv, s, i, torch.ones(6, dtype=torch.bool), backend='triton')\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('expected ImportError')\n"
        "assert 'attention.triton_tree' not in sys.modules\n"
        "from attention.layout import TreeAttentionSpec, plan_tree_attention\n"
        "from attention import TorchTreeAttention\n"
        "spec = TreeAttentionSpec(i, kv, s, torch.ones(6, dtype=torch.bool), 2, 1, 16)\n"
        "assert torch.equal(TorchTreeAttention().run(plan_tree_attention(spec), q, k, k), out)\n"
        "assert 'attention.triton_tree' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr

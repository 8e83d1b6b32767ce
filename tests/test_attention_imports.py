"""`attention`'s module structure: imports go one way, and every backend's run() has the one signature."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention"


def imports_of(path: Path) -> set[str]:
    """The ``attention.*`` modules a file imports, anywhere in it (functions and TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "attention":  # `from attention import masks` imports attention.masks
                found |= {f"attention.{a.name}" for a in node.names if (PACKAGE / f"{a.name}.py").exists()}
            elif node.module.startswith("attention."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attention.")}
    return found


def module_graph() -> dict[str, set[str]]:
    return {f"attention.{p.stem}": imports_of(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt] if nxt in stack else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*stack, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_find_cycle_finds_a_circle() -> None:  # the check below can fail
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_attention() -> None:
    graph = module_graph()
    assert {"attention.layout", "attention.reference", "attention.tree_attn"} <= set(graph)
    assert find_cycle(graph) is None, find_cycle(graph)


def test_layout_is_the_bottom_and_backends_import_only_it() -> None:
    graph = module_graph()
    assert graph["attention.layout"] <= {"attention.plan"}  # a TYPE_CHECKING import for one annotation
    assert graph["attention.reference"] == {"attention.layout"}
    assert graph["attention.triton_tree"] == {"attention.layout"}
    assert "attention.tree_attn" not in graph["attention.masks"] | graph["attention.plan"]


def test_every_backend_run_has_the_one_signature() -> None:
    from attention.layout import TreeAttentionBackend
    from attention.reference import TorchTreeAttention

    want = inspect.signature(TreeAttentionBackend.run)
    assert list(want.parameters) == ["self", "layout", "q", "k_cache", "v_cache", "out"]
    assert inspect.signature(TorchTreeAttention.run) == want
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from attention.triton_tree import TritonTreeAttention

    assert inspect.signature(TritonTreeAttention.run) == want

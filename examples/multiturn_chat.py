"""A multi-turn chat against a ReAnchor server: radix-cache reuse and acceptance per turn.

Start a server first (examples/serve_reanchor.sh), then::

    python examples/multiturn_chat.py --url http://127.0.0.1:30000

Each turn resends the whole conversation. SGLang's radix cache holds the KV of every
committed token, so turn k+1 recomputes only the new user message: ``cached`` below
is the number of prompt tokens served from the cache. ReAnchor never puts a rejected
draft into the cache (only committed tokens are inserted), which is why reuse works
exactly as without speculation. ``accept`` is the turn's mean acceptance length
(tokens committed per target forward, bonus included; 1.0 = no speedup).
"""

from __future__ import annotations

import argparse
import time

import sglang as sgl

QUESTIONS = [
    "Name three primary colors.",
    "Which of them is the color of the sky?",
    "Write a four-line poem about that color.",
]


@sgl.function
def chat_turn(s, history: list[tuple[str, str]], question: str, max_tokens: int):
    s += sgl.system("You are a concise assistant.")
    for user, assistant in history:
        s += sgl.user(user)
        s += sgl.assistant(assistant)
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    args = parser.parse_args()

    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    history: list[tuple[str, str]] = []
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'new':>4} {'accept':>6} {'tok/s':>6}  answer")
    for turn, question in enumerate(QUESTIONS[: args.turns], 1):
        start = time.perf_counter()
        state = chat_turn.run(history=history, question=question, max_tokens=args.max_tokens)
        answer = state["answer"].strip()  # waits for the generation
        meta = state.get_meta_info("answer") or {}
        seconds = time.perf_counter() - start
        new = meta.get("completion_tokens", 0)
        accept = meta.get("spec_accept_length")
        print(f"{turn:>4} {meta.get('prompt_tokens', 0):>6} {meta.get('cached_tokens', 0):>6} {new:>4} "
              f"{accept if accept is None else round(accept, 2)!s:>6} {new / seconds:>6.2f}  {answer[:60]!r}")
        history.append((question, answer))


if __name__ == "__main__":
    main()

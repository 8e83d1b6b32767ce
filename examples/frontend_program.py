"""An SGLang frontend program (``gen``, ``select``, a regex ``gen``, ``fork``) run against a ReAnchor server.

Start a server first (examples/serve_reanchor.sh), then::

    python examples/frontend_program.py --url http://127.0.0.1:30000

The program is ordinary SGLang: ReAnchor changes how fast tokens come, never which
tokens (at temperature 0 they equal plain decoding). Each ``gen`` reports SGLang's
speculative metrics in its meta info: ``spec_accept_length`` (tokens committed per
target forward, bonus included) and ``spec_verify_ct`` (target forwards).
"""

from __future__ import annotations

import argparse
import time

import sglang as sgl


@sgl.function
def city_facts(s, city: str, max_tokens: int):
    s += sgl.user(f"Give one short fact about {city}.")
    s += sgl.assistant(sgl.gen("fact", max_tokens=max_tokens, temperature=0))
    s += sgl.user("Now say in one sentence why that is interesting.")
    s += sgl.assistant(sgl.gen("why", max_tokens=max_tokens, temperature=0))
    # select scores each choice with the target's logprobs; a regex gen is grammar-constrained
    s += sgl.user(f"Is {city} a capital city? Answer yes or no.")
    s += sgl.assistant(sgl.select("capital", choices=["yes", "no"]))
    s += sgl.user(f"In which year was {city} founded? Reply with the year only.")
    s += sgl.assistant(sgl.gen("year", max_tokens=8, regex=r"[0-9]{1,4}", temperature=0))
    # fork: two answers drafted and verified side by side, then joined
    forks = s.fork(2)
    for f, topic in zip(forks, ("food", "weather")):
        f += sgl.user(f"One sentence about the {topic} in {city}.")
        f += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))
    forks.join()
    s["food"], s["weather"] = forks[0]["answer"], forks[1]["answer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cities", nargs="+", default=["Paris", "Tokyo"])
    args = parser.parse_args()

    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    start = time.perf_counter()
    states = city_facts.run_batch([{"city": c, "max_tokens": args.max_tokens} for c in args.cities])
    fields = ("fact", "why", "capital", "year")
    answers = [[state[name] for name in fields] for state in states]  # waits for the generations
    seconds = time.perf_counter() - start
    for city, state, texts in zip(args.cities, states, answers):
        print(f"== {city}")
        for name, text in zip(fields, texts):
            meta = state.get_meta_info(name) or {}
            print(f"  {name}: {text.strip()!r}")
            print(f"    tokens {meta.get('completion_tokens')}, accept length {meta.get('spec_accept_length')}, "
                  f"target forwards {meta.get('spec_verify_ct')}")
        for name in ("food", "weather"):
            print(f"  {name} (fork): {state[name].strip()!r}")
    print(f"{len(args.cities)} programs in {seconds:.1f} s")


if __name__ == "__main__":
    main()

"""A bounded soak of a REANCHOR HTTP server: concurrent streams, aborts, sessions, bad requests.

One REANCHOR server (``python -m sglang.launch_server`` on CPU, the tiny pair with a
character tokenizer, ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1`` so SGLang's own
idle leak check *raises* in the scheduler instead of warning) is driven by a fixed
mix of clients at once, every loop with a fixed count and every call with a time limit:

- greedy requests that run to the end, half of them streamed;
- streams whose client disconnects after two chunks;
- requests aborted through ``/abort_request`` while they run;
- two-turn sessions whose second turn extends the first (radix-cache reuse);
- requests SGLang or the plugin must refuse: an over-long prompt, invalid sampling
  parameters, a ``custom_logit_processor``.

Afterwards the server must still answer, every completed answer must equal a plain
server's, and the scheduler must have run its idle leak check without raising
(KV pool, request pool; the plugin's suffix slots are keyed by request-pool slot, so
they are bounded by it). Printed: requests served, aborted, rejected, leaked.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from http_server import launch
from test_serving_cpu import pair  # noqa: F401  (the module fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from factories import char_tokenizer  # noqa: E402

OFFSET = '{"policy": "offset"}'
PROMPTS = ["abc abc abc", "hello: ", "q: is it? a: ", "two ways: ", "a-b-c-", "deed ", "0123", "xyz xyz",
           "the cat ", "lorem ", "aaaa", "b: c: d: "]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
TIMEOUT = 600


def _generate(url: str, text: str, params: dict, **extra) -> requests.Response:
    return requests.post(url + "/generate", json={"text": text, "sampling_params": params, **extra}, timeout=TIMEOUT)


def _stream(url: str, text: str, stop_after: int | None = None) -> tuple[str, int]:
    """Stream a greedy request; with ``stop_after``, disconnect after that many chunks."""
    body = {"text": text, "sampling_params": GREEDY, "stream": True}
    out, chunks = "", 0
    with requests.post(url + "/generate", json=body, stream=True, timeout=TIMEOUT) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            out, chunks = json.loads(line[6:])["text"], chunks + 1
            if stop_after is not None and chunks >= stop_after:
                break  # closing the response drops the connection mid-stream
    return out, chunks


def _aborted(url: str, rid: str) -> str:
    """A long request, aborted by rid while it runs; returns its finish reason."""
    result: dict = {}

    def run() -> None:
        result["r"] = _generate(url, "abc abc abc", {**GREEDY, "max_new_tokens": 300}, rid=rid)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    requests.post(url + "/abort_request", json={"rid": rid}, timeout=TIMEOUT)
    t.join(TIMEOUT)
    r = result["r"]
    body = r.json()
    return body["meta_info"]["finish_reason"]["type"] if r.ok else f"http {r.status_code}"


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def servers(request, pair, tmp_path_factory, monkeypatch_module):  # noqa: F811
    """Both servers at ``--tp-size`` 1 and 2 (gloo; one core per rank)."""
    if request.param > (os.cpu_count() or 1):
        pytest.skip(f"--tp-size {request.param} binds one core per rank")
    root, target, _ = pair
    char_tokenizer(target.config.vocab_size).save_pretrained(root / "target")
    monkeypatch_module.setenv("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "1")
    logs = tmp_path_factory.mktemp(f"soak-tp{request.param}")
    tp = ["--tp-size", str(request.param)]
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(map(str, range(request.param)))}
    with launch(root, None, extra_args=["--disable-overlap-schedule", *tp], extra_env=env) as plain, \
            launch(root, "REANCHOR", OFFSET, logs / "trace.jsonl",
                   extra_args=["--enable-custom-logit-processor", *tp], extra_env=env) as spec:
        yield plain, spec, root


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_soak_nothing_lost_nothing_leaked(servers):
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    plain, spec, root = servers
    jobs = (
        [("complete", p) for p in PROMPTS[:6]]
        + [("stream", p) for p in PROMPTS[6:]]
        + [("disconnect", p) for p in PROMPTS[:4]]
        + [("abort", f"soak-abort-{i}") for i in range(2)]
        + [("session", p) for p in PROMPTS[:2]]
        + [("too_long", "a" * 5000), ("bad_temperature", PROMPTS[0]), ("bad_top_p", PROMPTS[1]),
           ("custom_processor", PROMPTS[2])]
    )
    bad = {
        "too_long": {},
        "bad_temperature": {"temperature": -1.0},
        "bad_top_p": {"top_p": 2.0},
    }

    def run(job: tuple[str, str]) -> tuple[str, str, object]:
        kind, arg = job
        if kind == "complete":
            r = _generate(spec, arg, GREEDY)
            r.raise_for_status()
            return kind, arg, r.json()["text"]
        if kind == "stream":
            return kind, arg, _stream(spec, arg)[0]
        if kind == "disconnect":
            return kind, arg, _stream(spec, arg, stop_after=2)[1]
        if kind == "abort":
            return kind, arg, _aborted(spec, arg)
        if kind == "session":  # turn 2 = turn 1's prompt and answer, then more: served from the radix cache
            first = _generate(spec, arg, GREEDY).json()["text"]
            r = _generate(spec, arg + first + " and ", GREEDY).json()
            return kind, arg, (first, r["text"], r["meta_info"]["cached_tokens"])
        if kind == "custom_processor":
            r = _generate(spec, arg, {**GREEDY, "custom_params": {"token_ids": [5]}},
                          custom_logit_processor=DisallowedTokensLogitsProcessor().to_str())
            return kind, arg, (r.status_code, r.text)
        r = _generate(spec, arg, {**GREEDY, **bad[kind]})
        return kind, arg, (r.status_code, r.text)

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    assert time.monotonic() - start < 1500

    served = aborted = rejected = 0
    for kind, arg, value in results:
        if kind in ("complete", "stream"):
            want = _generate(plain, arg, GREEDY).json()["text"]
            assert value == want, (kind, arg)
            served += 1
        elif kind == "session":
            first, second, cached = value
            assert first == _generate(plain, arg, GREEDY).json()["text"], arg
            assert second == _generate(plain, arg + first + " and ", GREEDY).json()["text"], arg
            assert cached > 0  # the second turn reused the first turn's KV
            served += 2
        elif kind == "disconnect":
            assert value == 2
            aborted += 1
        elif kind == "abort":
            assert value == "abort", value
            aborted += 1
        else:
            status, text = value
            assert status == 400, (kind, status, text[:300])
            if kind == "custom_processor":
                assert "custom_logit_processor" in text
            rejected += 1

    # idle: the scheduler runs its leak check (strict: a leak raises and kills it), then must still serve
    time.sleep(5)
    assert requests.get(spec + "/health_generate", timeout=TIMEOUT).status_code == 200
    after = _generate(spec, PROMPTS[0], GREEDY)
    assert after.ok and after.json()["text"] == _generate(plain, PROMPTS[0], GREEDY).json()["text"]
    logs = "".join(p.read_text(errors="replace") for p in root.glob("server-*.log"))
    leaked = logs.count("memory leak detected")
    print(f"\nsoak: {served} served, {aborted} aborted, {rejected} rejected with a clear error, {leaked} leaked")
    assert leaked == 0

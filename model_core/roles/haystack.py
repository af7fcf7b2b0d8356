"""The needle-in-a-haystack prompt of the retrieval probe: a haystack the team wrote for it, and the needle.

The haystack is plain prose about nothing in particular (a town, its weather, its trades), so that no sentence
of it answers the question; the needle is one sentence with a password of three words drawn by the seed.
"""

from __future__ import annotations

import numpy as np

HAYSTACK: tuple[str, ...] = (
    "The town sits at the bend of a slow river, where the valley opens into wide fields of barley and oats.",
    "Every spring the farmers mend their fences and the children count the swallows that come back to the barns.",
    "The market opens at dawn on Tuesdays, and by noon the square smells of bread, onions and wet canvas.",
    "An old stone bridge crosses the river; its seven arches were rebuilt after the flood of the dry summer.",
    "The baker keeps a ledger of every loaf he has sold, written in pencil in a book with a green cover.",
    "In the evenings the men play cards in the back room of the inn while the landlord polishes the glasses.",
    "The school has two classrooms, a small library and a garden where the pupils grow beans and sunflowers.",
    "A carrier brings letters from the city twice a week, and people wait for him by the fountain.",
    "The church clock runs four minutes fast, and nobody has wanted to climb the tower to set it right.",
    "On the hill above the town there is a windmill that no longer turns, its sails grey and split.",
    "The blacksmith shoes horses in the mornings and repairs ploughs, gates and kettles in the afternoons.",
    "When it rains for a week the lower street floods, and the shopkeepers lift their goods onto the shelves.",
    "The doctor visits the farms on a bicycle, with a leather bag tied behind the saddle.",
    "Most houses have a vegetable plot, a woodpile and a bench by the door where the old people sit in the sun.",
    "In autumn the orchards are full of pickers, and carts of apples go down to the cider press by the mill.",
    "The river is shallow enough to wade in August, and the boys fish for small trout under the willows.",
    "Winter brings snow to the high pastures, and the shepherds bring the flocks down to the sheds by the road.",
    "The town council meets in a room above the post office and argues for hours about the price of lamp oil.",
    "A painter from the coast once spent a summer here and left a picture of the bridge in the inn's hallway.",
    "The road to the city is long and dusty, and the bus that runs along it is always an hour late.",
    "The weaver's shop has a loom older than anyone in the town, and it still makes blankets every winter.",
    "At harvest time the whole town eats together at long tables set out in the square under strings of lamps.",
)

PASSWORD_WORDS: tuple[str, ...] = (
    "amber", "falcon", "copper", "lantern", "violet", "harbor", "meadow", "silver", "thunder", "orchid",
    "granite", "willow", "crimson", "glacier", "saffron", "cobalt",
)

QUESTION = "\nQ: What is the lighthouse keeper's password?\nA: The secret password of the lighthouse keeper is"
NEEDLE = "The secret password of the lighthouse keeper is {password}."


def password(seed: int) -> str:
    """Three distinct words of ``PASSWORD_WORDS`` drawn by ``seed``, e.g. "amber falcon copper"."""
    rng = np.random.default_rng(seed)
    return " ".join(PASSWORD_WORDS[i] for i in rng.choice(len(PASSWORD_WORDS), size=3, replace=False))


def haystack_prompt(secret: str, depth: float, n_sentences: int = len(HAYSTACK)) -> tuple[str, str]:
    """The prompt with the needle after ``depth`` (0-1) of the haystack's ``n_sentences`` sentences.

    Returns:
        (prompt, needle sentence); the prompt ends with the start of the answer, so the model's next words are
        the password.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}.")
    sentences = list(HAYSTACK[:n_sentences])
    needle = NEEDLE.format(password=secret)
    sentences.insert(round(depth * len(sentences)), needle)
    return " ".join(sentences) + QUESTION, needle

"""Which of a head's top contexts the atlas splits (the QK split and the direct logit effect, ``model_core.atlas.why``).

Each split context costs a pass of its whole text, and one pass serves every head with a context in that text. Two
rules, each taking up to ``n`` contexts a head from its list without the sink (texts too long to split left out):

- ``first``: the head's first ``n`` contexts. Over 1,000 texts of about 110 tokens, SmolLM2's 270 heads name 414
  different texts this way (138 for ``n`` = 1).
- ``shared``: the head's first context, and ``n`` − 1 more of its top K chosen so that few texts serve every head:
  first those in texts that some head's first context already names (in the head's list order), then, greedily, the
  text that the most heads still short have in their lists (ties to the earlier text), each of those heads taking its
  context there. The same corpus needs 161 texts for ``n`` = 3 (138 for the first contexts, 23 more). Every context
  split is one of the head's top K; their ranks are on the card.
- ``auto`` (the default): ``first`` while its contexts name at most ``AUTO_SHARED_FROM`` texts, else ``shared``: a
  small corpus is split exactly at each head's first contexts, a large one at the cost of a few hundred passes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, get_args

Pick = Literal["auto", "first", "shared"]
PICKS: tuple[str, ...] = get_args(Pick)
AUTO_SHARED_FROM = 200
"""``auto`` takes the ``first`` rule unless its contexts name more texts than this (each a pass to run again); then
``shared``."""


def qk_picks(lists: dict[tuple[int, int], list[int | None]], n: int,
             how: Pick = "auto") -> dict[tuple[int, int], list[int]]:
    """Each head's chosen contexts, as ranks in its list.

    Args:
        lists: (layer, head) -> the text id of each context it may split, in its list's order (one context a text;
            ranks not offered are absent: give ``None`` in their place to keep the ranks).
        n: contexts a head at most.
        how: ``auto``, ``first`` or ``shared`` (the module's docstring).

    Returns:
        (layer, head) -> ranks (ascending) into its list; heads with no context left out.
    """
    if how not in PICKS:
        raise ValueError(f"--qk-pick must be one of {', '.join(PICKS)}, got {how!r}.")
    offered = {lh: [(rank, t) for rank, t in enumerate(texts) if t is not None] for lh, texts in lists.items()}
    first = {lh: [rank for rank, _ in ranked[:n]] for lh, ranked in offered.items() if ranked and n}
    if how == "first" or n == 0:
        return first
    if how == "auto" and len({lists[lh][r] for lh, ranks in first.items() for r in ranks}) <= AUTO_SHARED_FROM:
        return first
    want = {lh: min(n, len(ranked)) for lh, ranked in offered.items()}
    picks: dict[tuple[int, int], list[int]] = {lh: [] for lh in offered}
    where = {lh: {t: rank for rank, t in ranked} for lh, ranked in offered.items()}  # text -> rank, per head

    def take(lh: tuple[int, int], text: int) -> None:
        picks[lh].append(where[lh].pop(text))

    chosen = {ranked[0][1] for ranked in offered.values() if ranked}
    for lh, ranked in offered.items():  # each head's best context, then its others in texts already traced
        for _, text in ranked:
            if len(picks[lh]) < want[lh] and (not picks[lh] or text in chosen):
                take(lh, text)
    short = {lh for lh in offered if len(picks[lh]) < want[lh]}
    while short:  # the text the most heads still short have in their lists
        count = Counter(t for lh in short for t in where[lh])
        text = min(count, key=lambda t: (-count[t], t))
        for lh in [lh for lh in short if text in where[lh]]:
            take(lh, text)
            if len(picks[lh]) == want[lh]:
                short.discard(lh)
    return {lh: sorted(p) for lh, p in picks.items() if p}

"""A one-line summary of a head from its atlas numbers, made by fixed rules (no language model).

The rules are tried in order; the first that holds names the head's kind:

1. **induction**: the induction share (mean over queries with an earlier copy of their token) ≥ ``induction`` and
   above the previous-token share;
2. **previous-token**: the share at offset −1 ≥ ``previous``;
2b. **induction (by its circuit)**: the component that raises its top scores most on the key side is a
   previous-token head (rule 2) with a share ≥ ``circuit``: the K-composition of an induction head (Olsson et al.).
   A short corpus with few repeated tokens gives an induction head little to do (its weight then goes to the first
   token), so its behaviour may not show; the summary then says what it does on this corpus beside the circuit;
3. **duplicate-token**: the same-token share (mean over queries whose token occurs elsewhere) ≥ ``duplicate``;
4. **self**: the share at offset 0 ≥ ``self_share``;
5. **sink**: the share at the first token ≥ ``sink``;
6. **punctuation**: the share at punctuation ≥ ``punctuation``;
7. **local**: the shares at offsets 0 to −3 together ≥ ``local``;
8. **broad**: none of the above.

Then, where known: the component that raises its top scores most on the key side ("driven by L3H1 on the key
side") and "copies" when the OV copying score ≥ ``copies``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("induction", "previous-token", "duplicate-token", "self", "sink", "punctuation", "local", "broad")


@dataclass(frozen=True)
class SummaryRules:
    """The thresholds of the rules (the module's docstring)."""

    induction: float = 0.3
    previous: float = 0.5
    duplicate: float = 0.4
    self_share: float = 0.5
    sink: float = 0.6
    punctuation: float = 0.4
    local: float = 0.6
    copies: float = 0.5
    circuit: float = 0.5

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"The {name} threshold must be between 0 and 1, got {value}.")


def _share(profile: dict[str, Any], key: str) -> float:
    value = profile.get(key)
    return 0.0 if value is None else float(value)


def kind_of(profile: dict[str, Any], rules: SummaryRules = SummaryRules()) -> tuple[str, str]:
    """(kind, its phrase) from a head's profile."""
    ind, prev = _share(profile, "induction"), _share(profile, "offset_-1")
    if ind >= rules.induction and ind > prev:
        return "induction", f"induction: looks at the token after an earlier copy of the query token ({ind:.2f})"
    if prev >= rules.previous:
        return "previous-token", f"previous-token head: {prev:.2f} of its weight one token back"
    same = _share(profile, "same_token")
    if same >= rules.duplicate:
        return "duplicate-token", f"duplicate-token head: {same:.2f} of its weight on another copy of the query token"
    own = _share(profile, "offset_0")
    if own >= rules.self_share:
        return "self", f"self head: {own:.2f} of its weight on the query token itself"
    first = _share(profile, "first_token")
    if first >= rules.sink:
        return "sink", f"sink: {first:.2f} of its weight on the first token"
    punct = _share(profile, "punctuation")
    if punct >= rules.punctuation:
        return "punctuation", f"punctuation head: {punct:.2f} of its weight on punctuation"
    local = sum(_share(profile, f"offset_{d}") for d in ("0", "-1", "-2", "-3"))
    if local >= rules.local:
        return "local", f"local head: {local:.2f} of its weight within three tokens back"
    entropy = profile.get("entropy_bits")
    spread = f"mean entropy {entropy:.1f} bits" if entropy is not None else "no clear target"
    return "broad", f"broad head: {spread}, {_share(profile, 'offset_further'):.2f} of its weight further back"


def summarise(profile: dict[str, Any], key_side: list[list[Any]] | None = None, copying: float | None = None,
              rules: SummaryRules = SummaryRules(), previous_heads: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(kind, one-line summary) of a head; ``previous_heads``: the labels ("L3H1") of the previous-token heads."""
    kind, line = kind_of(profile, rules)
    top = key_side[0] if key_side else None
    if kind not in ("induction", "previous-token") and top is not None and top[0] in previous_heads \
            and top[1] is not None and top[1] >= rules.circuit:
        ind = _share(profile, "induction")
        line = (f"induction (by its circuit): keys driven by previous-token head {top[0]} ({top[1]:.2f} of the score "
                f"above the row mean); on this corpus {ind:.2f} of its weight after an earlier copy of the query "
                f"token, {line}")
        kind = "induction"
        top = None  # said already
    if top is not None:
        line += f"; driven by {top[0]} on the key side"
    if copying is not None and copying >= rules.copies:
        line += "; copies"
    return kind, line

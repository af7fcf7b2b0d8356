"""Direct logit attribution of a long input: one extra pass that keeps what the last position needs.

A long input's compact trace keeps queries and keys, not the values or the residual stream that ``attribute`` reads.
This pass runs the model once more through the one forward route, in its compact form (sdpa, no n² weights), and
keeps every head's z at the last position (the output projection's input, from a hook) and the residual stream
(the route's own hidden states): (layer, head, d_head) and (layer + 1, d_model) numbers, whatever the length. The
split over source tokens needs every value, so it is left to full traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.attribution import (
    Attribution,
    decompose,
    require_decoder_family,
)
from model_core.families.hook_install import open_run
from model_core.families.hooks import HookRun
from model_core.gate import GATE
from model_core.trace.forward import top_predictions
from model_core.trace.shape import freeze_arrays


@dataclass(frozen=True, eq=False)
class LastPosition:
    """What the attribution reads at the last position, from one pass.

    Attributes:
        z: every head's input to the output projection. Shape: (layer, head, d_head) float64.
        hidden: the residual stream: the embedding, then every layer's output. Shape: (layer + 1, d_model) float32.
        top_ids: the model's top next-token predictions there, best first. Shape: (k,) int64.
    """

    z: np.ndarray
    hidden: np.ndarray
    top_ids: np.ndarray

    def __post_init__(self) -> None:
        freeze_arrays(self)


def last_position_pass(family: Any, model: Any, token_ids: np.ndarray, k: int = 10) -> LastPosition:
    """Run the model once in compact form and keep every head's z and the residual stream at the last position.

    Shape: token_ids (pos,).

    Raises:
        NotADecoder: the family is an encoder's.
    """
    require_decoder_family(family)
    device = next(model.parameters()).device
    ids = torch.as_tensor(np.array(token_ids), dtype=torch.long, device=device)[None]  # (1, pos)
    kept: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def read(z: torch.Tensor, _point: Any) -> None:  # (batch, pos, head, d_head): the last position only,
            kept[layer] = z[0, -1].detach().clone()  # left on the model's device (one copy to the host below)
        return read
    n_layers = family.n_layers(model.config)
    reads = HookRun(hooks=[(f"blocks.{i}.attn.hook_z", keep(i)) for i in range(n_layers)])
    with GATE.turn(), open_run(model, family, reads):  # until the tensors are numpy
        out = family.forward(model, ids, torch.zeros_like(ids), None, vectors=False, hidden=True, compact=True)
        last = torch.stack([h[0, -1] for h in out.hidden])  # (layer + 1, d_model)
        top = top_predictions(family, model, last[-1:], k)[0][0]
        hidden = last.detach().to("cpu", torch.float32).numpy()
        z = torch.stack([kept[i] for i in range(n_layers)]).to("cpu", torch.float64).numpy()  # (layer, head, d_head)
    return LastPosition(z=z, hidden=hidden, top_ids=top)


def attribute_last(family: Any, model: Any, token_ids: np.ndarray, tokens: tuple[str, ...], answer_id: int,
                   foil_id: int | None = None, expected_top: int | None = None, *,
                   last: LastPosition | None = None) -> Attribution:
    """``attribute`` at the last position of any input, from one extra pass (``last_position_pass``, or ``last`` when
    it was run already) instead of a full trace: the same numbers, with no source split (``Attribution.sources``
    needs the full trace).

    Args:
        token_ids: the input's token ids (a compact trace's ``token_ids``). Shape: (pos,).
        tokens: its tokens.
        expected_top: the top prediction the trace recorded at the last position (a model check), or None.

    Raises:
        NotADecoder: the family is an encoder's. ValueError, RuntimeError: as ``decompose``.
    """
    last = last or last_position_pass(family, model, token_ids)
    return decompose(model, family, last.z, last.hidden, tuple(tokens), len(tokens) - 1, answer_id, foil_id,
                     int(last.top_ids[0]) if expected_top is None else expected_top)

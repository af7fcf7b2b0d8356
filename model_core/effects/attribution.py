"""Direct logit attribution (DLA): each head's, each MLP's and the embedding's direct effect on a decoder's logit.

Every component writes into the residual stream; the final residual goes through the final norm and the
unembedding. With the final norm's statistics frozen at the full final residual, that read-out is affine, so each
write gets an exact share of the logit (or of the logit difference with a foil), and the shares sum to it:

    logit = embed + Σ heads + Σ mlps + rest

A head's write at position i is W_Oʰ·z_h(i) with z_h(i) = Σ_j αᵢⱼʰ·vⱼ, read from the full trace (``weights`` and
``values``); an MLP's is its own modules' output, run on one vector: the residual stream before it plus the
attention write those z give. So the sum is a real check: a wrong head write feeds the MLPs a wrong input and is not
absorbed by them (for a block it does not know, the MLP's effect is the layer's update minus the attention write, and
the sum then holds by construction). Gemma 2/3 normalise the attention output before the residual sum: that norm is
frozen at the attention output too. Nothing runs the whole model again (only each MLP, on one vector): the read-out uses its weights and the trace (a long input's compact trace has no values: ``attribution_long`` takes one
more pass for the last position). See Elhage et al. (2021), "A Mathematical Framework for Transformer
Circuits", and Nanda's TransformerLens ``decompose_resid`` / ``stack_head_results``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from model_core.effects.attribution_readout import (
    final_readout,
    layer_readout,
    mlp_write,
    output_projections,
    project,
)
from model_core.families import checks
from model_core.families.checks import NotADecoder, NotOneToken, token_id_of  # noqa: F401 - this module's API too
from model_core.kernel import rounding_tolerance
from model_core.trace.shape import LayerHeadGrid, freeze_arrays

CHECK_TOLERANCE = 1e-4
"""How far (relative to the larger of the logit and 1) the parts' sum may be from the model's own logit."""




@dataclass(frozen=True, eq=False)
class Attribution(LayerHeadGrid):
    """The direct effect of every component on one logit (or logit difference) at one position.

    Attributes:
        tokens: the trace's tokens.
        position: the position whose next-token logit is split (counted from 0).
        answer_id, foil_id: the answer token, and the foil (None: the logit itself, not a difference).
        logit: the model's logit of the answer at ``position``, or logit(answer) − logit(foil), before any
            final-logit softcap (Gemma 2's), computed by the model's own final norm and unembedding.
        embed: the embedding's direct effect (token and learned position embeddings; Gemma's scaled ones).
        heads: each head's direct effect. Shape: (layer, head) float64.
        mlps: each MLP's direct effect. Shape: (layer,) float64.
        rest: the biases no component writes: the attention output bias, a norm's bias, the unembedding's bias.
        head_readout: the direction in each head's z its effect is read along (W_Oʰᵀ pulled back from the
            unembedding through the frozen norms): effect = z_h · head_readout[l, h]. Shape: (layer, head, d_head).
        final_softcap: the model's final-logit softcap (Gemma 2), which ``logit`` is before; else None.
        mlps_run: True when every MLP's effect was read by running its own modules on the residual stream the heads'
            writes give (so ``total == logit`` checks the heads' writes); False for a block this does not know, whose
            MLP effect is the layer's update minus the attention write (the sum then holds by construction and
            checks only the frozen final norm and the unembedding).
    """

    tokens: tuple[str, ...]
    position: int
    answer_id: int
    foil_id: int | None
    logit: float
    embed: float
    heads: np.ndarray
    mlps: np.ndarray
    rest: float
    head_readout: np.ndarray
    final_softcap: float | None = None
    mlps_run: bool = True

    def __post_init__(self) -> None:
        n_layers, n_heads = self.heads.shape
        assert self.mlps.shape == (n_layers,) and self.head_readout.shape[:2] == (n_layers, n_heads)
        assert 0 <= self.position < len(self.tokens)
        freeze_arrays(self)

    @property
    def total(self) -> float:
        """The parts' sum: embed + every head + every MLP + rest (``logit``, within rounding: the check)."""
        return float(self.embed + self.heads.sum() + self.mlps.sum() + self.rest)

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.heads.shape

    def sources(self, trace: Any, layer: int, head: int) -> np.ndarray:
        """One head's effect split over its source tokens j: αᵢⱼʰ · (vⱼ · head_readout), summing to ``heads[l, h]``.

        Args:
            trace: the full trace this attribution was computed from.

        Shape: -> (k_pos,) float64; zero past the position (a decoder's mask).
        """
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise ValueError(f"layer {layer}, head {head} is out of range: this model has layers 0-"
                             f"{self.n_layers - 1} and heads 0-{self.n_heads - 1}.")
        weights = trace.weights[layer, head, self.position].astype(np.float64)  # (k_pos,)
        values = trace.values[layer, head].astype(np.float64)  # (k_pos, d_head)
        return weights * (values @ self.head_readout[layer, head])

    def top_heads(self, k: int = 5, sign: int = 1) -> list[tuple[int, int, float]]:
        """The ``k`` heads with the largest effect (``sign`` 1) or the most negative (``sign`` -1), as
        (layer, head, effect), strongest first; heads whose effect has the other sign are left out."""
        flat = self.heads.ravel() * sign
        order = np.argsort(-flat, kind="stable")[:k]
        return [(int(i // self.n_heads), int(i % self.n_heads), float(self.heads.ravel()[i]))
                for i in order if flat[i] > 0]

    def grid_rows(self) -> list[dict[str, Any]]:
        """Every component as one CSV row: component, layer, head, effect (heads, then MLPs, embed and rest)."""
        rows = [{"component": "head", "layer": la, "head": h, "effect": float(self.heads[la, h])}
                for la in range(self.n_layers) for h in range(self.n_heads)]
        rows += [{"component": "mlp", "layer": la, "head": "", "effect": float(v)} for la, v in enumerate(self.mlps)]
        rows += [{"component": name, "layer": "", "head": "", "effect": float(v)}
                 for name, v in (("embed", self.embed), ("rest", self.rest))]
        return rows

    def to_json(self) -> dict[str, Any]:
        """The command line's JSON: tokens, answer_id, foil_id, logit, embed, heads (L×H), mlps, rest, and the
        position, the parts' sum and (for a capped model) a note."""
        out = {"tokens": list(self.tokens), "answer_id": self.answer_id, "foil_id": self.foil_id,
               "logit": self.logit, "embed": self.embed, "heads": self.heads.tolist(), "mlps": self.mlps.tolist(),
               "rest": self.rest, "position": self.position, "parts_sum": self.total, "mlps_run": self.mlps_run}
        if self.final_softcap is not None:
            out["note"] = (f"logit is before the model's final-logit softcap ({self.final_softcap:g}·tanh(x/"
                           f"{self.final_softcap:g})), which is not linear.")
        return out


def require_decoder_family(family: Any) -> None:
    """Raise ``NotADecoder`` (a ValueError) unless the family is a decoder's (``families.checks.require_decoder``)."""
    checks.require_decoder(family, "direct logit attribution", instead="The contribution graph works for encoders.")


def require_decoder(trace: Any, family: Any) -> None:
    """Raise ``NotADecoder`` (a ValueError) unless the trace is a decoder's full trace."""
    require_decoder_family(family if trace.is_decoder else trace.family)
    if not hasattr(trace, "values") or not hasattr(trace, "hidden_states"):
        raise ValueError("attribute() reads a full trace (its values and hidden states); this long input has only a "
                         "compact trace: use model_core.effects.attribution_long.attribute_last, which runs one more "
                         "pass for the last position.")


def position_of(trace: Any, position: int) -> int:
    """A position counted from 0 (negative counts from the end). Raises ValueError outside the input."""
    n = trace.n_tokens
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
        raise ValueError(f"position must be a whole number, got {position!r}.")
    pos = int(position) + n if position < 0 else int(position)
    if not 0 <= pos < n:
        raise ValueError(f"Position {position} is outside this input of {n} tokens: pick one from {-n} to {n - 1}.")
    return pos


def top_two(trace: Any, position: int = -1) -> tuple[int, int]:
    """The model's top prediction and runner-up at ``position`` (the default answer and foil)."""
    ids = trace.next_token_ids
    if ids is None or ids.shape[1] < 2:
        raise ValueError("This trace keeps no next-token predictions; give the answer (and foil) as tokens.")
    pos = position_of(trace, position)
    return int(ids[pos, 0]), int(ids[pos, 1])


def _check_ids(model: Any, answer_id: int, foil_id: int | None) -> None:
    vocab = int(model.get_output_embeddings().weight.shape[0])
    for name, i in (("answer", answer_id), ("foil", foil_id)):
        if i is not None and not 0 <= int(i) < vocab:
            raise ValueError(f"The {name} id {i} is outside this model's vocabulary of {vocab} tokens.")
    if foil_id is not None and int(foil_id) == int(answer_id):
        raise ValueError("The foil is the answer itself, so the logit difference is 0: pick another foil.")


def attribute(trace: Any, model: Any, family: Any, answer_id: int, foil_id: int | None = None,
              position: int = -1) -> Attribution:
    """Split the logit of ``answer_id`` (minus ``foil_id``'s) at ``position`` into every component's direct effect.

    Args:
        trace: a decoder's full trace (``AttentionTrace``), from ``model``.
        model: the loaded model the trace came from (its weights: W_O, the norms, the unembedding).
        family: its adapter (``model_core.families``).
        answer_id: the token whose logit is split (``token_id_of``, or the top prediction: ``top_two``).
        foil_id: a token whose logit is subtracted, or None.
        position: the position whose next-token logit is split; negative counts from the end.

    Raises:
        NotADecoder: the model is an encoder.
        ValueError: a compact trace, an id outside the vocabulary, a position outside the input, or a model that is
            not the trace's.
        RuntimeError: the parts do not sum to the model's logit (the check every call makes).

    Shape: heads (layer, head), mlps (layer,).
    """
    require_decoder(trace, family)
    pos = position_of(trace, position)
    # z_h(pos) = Σ_j α_pos,j v_j for every head at once (masked heads have zero weights).
    z = np.einsum("lhk,lhkd->lhd", trace.weights[:, :, pos], trace.values, dtype=np.float64, casting="same_kind")
    expected = None if trace.next_token_ids is None else int(trace.next_token_ids[pos, 0])
    return decompose(model, family, z, trace.hidden_states[:, pos], tuple(trace.tokens), pos, answer_id, foil_id,
                     expected)


def decompose(model: Any, family: Any, z: np.ndarray, hidden: np.ndarray, tokens: tuple[str, ...], position: int,
              answer_id: int, foil_id: int | None, expected_top: int | None = None) -> Attribution:
    """The attribution at one position from what it needs there: every head's z and the residual stream.

    Args:
        z: each head's input to the output projection at the position. Shape: (layer, head, d_head).
        hidden: the residual stream at the position: the embedding, then every layer's output. Shape: (layer + 1,
            d_model).
        expected_top: the top prediction the trace recorded there (a check that the model is the trace's), or None.

    Raises:
        ValueError: an id outside the vocabulary, a foil that is the answer, a model that is not the trace's.
        RuntimeError: the parts do not sum to the model's logit.
    """
    _check_ids(model, answer_id, foil_id)
    n_layers, n_heads, d_head = z.shape
    read = final_readout(model, family, hidden[-1], int(answer_id), foil_id)
    if expected_top is not None and read.top_id != expected_top:
        raise ValueError("This model's prediction differs from the trace's: pass the model the trace came from.")
    z, hidden = np.asarray(z, dtype=np.float64), np.asarray(hidden, dtype=np.float64)
    heads, mlps = np.zeros((n_layers, n_heads)), np.zeros(n_layers)
    readout = np.zeros((n_layers, n_heads, d_head))
    rest = read.bias
    independent = True
    for layer, (w_o, b_o) in enumerate(output_projections(family, model)):  # W_O: (d_model, head * d_head)
        output = project(w_o, z[layer].reshape(-1)) + (0.0 if b_o is None else b_o)  # the attention output there
        lr = layer_readout(family, model, layer, output, b_o, read.direction)
        readout[layer] = project(w_o.T, lr.direction).reshape(n_heads, d_head)  # W_Oʰᵀ g_l, per head
        heads[layer] = (z[layer] * readout[layer]).sum(-1)
        resid_mid = hidden[layer] + lr.written
        # The MLP's write is read from its own modules run on resid_mid, not as the layer's update minus the heads'
        # write: so the sum below checks the heads' writes (a wrong one feeds the MLP a wrong input and leaves a gap).
        written = mlp_write(family, model, layer, hidden[layer], resid_mid)
        independent = independent and written is not None
        mlps[layer] = (hidden[layer + 1] - resid_mid if written is None else written) @ read.direction
        rest += lr.rest
    softcap = getattr(model.config, "final_logit_softcapping", None)
    result = Attribution(tokens=tokens, position=position, answer_id=int(answer_id),
                         foil_id=None if foil_id is None else int(foil_id), logit=read.logit,
                         embed=float(hidden[0] @ read.direction), heads=heads, mlps=mlps, rest=float(rest),
                         head_readout=readout, final_softcap=None if softcap is None else float(softcap),
                         mlps_run=independent)
    _check_sum(result, next(model.parameters()).dtype)
    return result


def _check_sum(result: Attribution, dtype: Any = None) -> None:
    """The loud check: the parts must sum to the model's own logit (difference), within rounding (the MLPs are run
    again on one vector each, in the model's precision: ``dtype``)."""
    gap = abs(result.total - result.logit)
    size = abs(result.embed) + float(np.abs(result.heads).sum() + np.abs(result.mlps).sum()) + abs(result.rest)
    if gap > rounding_tolerance(CHECK_TOLERANCE, dtype) * max(abs(result.logit), size, 1.0):
        raise RuntimeError(f"Direct logit attribution does not add up: the parts sum to {result.total:.6f} but the "
                           f"model's logit is {result.logit:.6f} (gap {gap:.2e}). This model's blocks write into the "
                           "residual stream in a way the attribution does not know; please report it.")


def head_sources(trace: Any, model: Any, family: Any, layer: int, head: int, answer_id: int,
                 foil_id: int | None = None, position: int = -1) -> np.ndarray:
    """One head's direct effect split over its source tokens j: the term αᵢⱼʰ·W_Oʰ·vⱼ through the frozen norms onto
    the unembedding of the answer (minus the foil). The terms sum to ``attribute(...).heads[layer, head]``.

    Shape: -> (k_pos,) float64.
    """
    return attribute(trace, model, family, answer_id, foil_id, position).sources(trace, layer, head)

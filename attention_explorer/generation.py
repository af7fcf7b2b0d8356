"""Generation in a notebook, and the one view of a generated token's attention drawn on the text itself (the app's
Generate page draws the same HTML).

    import attention_explorer as ae
    g = ae.generate("What is the capital of France?")   # the bundled SmolLM2-135M-Instruct, offline
    g.reply, g.reply_start
    g.attention_on_text(0)        # what the first reply token looked at, shaded on the text
    g.candidates(0)               # the top next-token candidates at that step
"""

from __future__ import annotations

import html as html_lib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attention_explorer.notebook import Trace
from model_core.settings import BUNDLED_DECODER_ID

if TYPE_CHECKING:
    import pandas as pd

    from model_core.generate.generation import Generation

SHADE_RGB = (33, 102, 172)


def token_texts(tokenizer: Any, ids: list[int] | np.ndarray) -> list[str]:
    """Each token as the text it writes (" flies", not "Ġflies"; a special token as itself)."""
    return [tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]


def attention_text_html(texts: list[str], weights: np.ndarray, written: int, reply_start: int | None = None) -> str:
    """The text with each token shaded by the attention it gets from the query that wrote token ``written``, as
    escaped HTML spans (hover: the exact weight). The written token is outlined, the tokens after it are grey, and a
    teal mark shows where the reply starts.

    Args:
        texts: every token's text (``token_texts``).
        weights: the weights over positions 0..written - 1 (``model_core.generate.reading.writing_attention``);
            shaded relative to the largest, so small weights still show.
        written: the position of the written token.
        reply_start: the reply's first position, or None.

    Shape: weights (written,).
    """
    weights = np.asarray(weights, dtype=np.float64)
    top = float(weights.max()) if weights.size else 1.0
    spans = []
    for i, text in enumerate(texts):
        shown = html_lib.escape(text).replace("\n", "↵<br>")
        if i == reply_start:
            spans.append('<span style="color:#2a9d8f;font-weight:600" title="the reply starts here">▸</span>')
        if i < written:
            alpha = weights[i] / top if top > 0 else 0.0
            spans.append(f'<span title="{i}: weight {weights[i]:.4f}" style="background:rgba({SHADE_RGB[0]},'
                         f'{SHADE_RGB[1]},{SHADE_RGB[2]},{alpha:.3f});color:{"white" if alpha > 0.6 else "inherit"};'
                         f'border-radius:2px">{shown}</span>')
        elif i == written:
            spans.append(f'<span title="{i}: the token written" style="outline:2px solid #e4572e;'
                         f'border-radius:2px">{shown}</span>')
        else:
            spans.append(f'<span title="{i}: written later" style="color:#9a9a9a">{shown}</span>')
    return ('<div style="white-space:pre-wrap;line-height:1.9;font-family:ui-monospace,monospace;font-size:0.9em">'
            + "".join(spans) + "</div>")


@dataclass(frozen=True)
class TextView:
    """A generated token's attention on the text, drawn inline by Jupyter."""

    html: str

    def _repr_html_(self) -> str:
        return self.html


class GeneratedTrace(Trace):
    """The ``Trace`` of a whole generated sequence (prompt and reply) that knows where the reply starts.

    Attributes:
        core: the sequence's ``AttentionTrace`` (``core.reply_start`` set).
        generation: the ``model_core.generate.generation.Generation`` (its ids, candidates and why it ended).
        model_id: the model that wrote it; ``generation.request(model_id)`` is the sequence's ``TraceRequest``.
    """

    def __init__(self, core: Any, generation: Generation, texts: list[str], model_id: str) -> None:
        super().__init__(core)
        self.generation = generation
        self.model_id = model_id
        self._texts = texts

    def __repr__(self) -> str:
        g = self.generation
        return (f"<GeneratedTrace {self.core.description}: {len(g.prompt_ids)} prompt + {g.n_new} reply tokens "
                f"(ended by {g.reason}), {self.core.n_layers} layers x {self.core.n_heads} heads>")

    @property
    def reply_start(self) -> int:
        """The position of the reply's first token (the prompt's length)."""
        return int(self.core.reply_start)

    @property
    def reply(self) -> str:
        """The reply's text, special tokens skipped."""
        return self.generation.reply

    @property
    def reply_pieces(self) -> list[str]:
        """The reply's tokens (the tokenizer's pieces)."""
        return list(self.core.tokens[self.reply_start:])

    def _position(self, step: int) -> int:
        n_new = self.core.n_tokens - self.reply_start
        if not -n_new <= step < n_new:
            raise ValueError(f"step {step} is out of range: the reply has {n_new} tokens (0-{n_new - 1}).")
        return self.reply_start + step % n_new

    def attention_weights(self, step: int, how: str = "head", layer: int = 0, head: int = 0) -> np.ndarray:
        """What the query that wrote reply token ``step`` (from 0; -1 the last) attended to (``writing_attention``).

        Shape: -> (position,) float64, position = reply_start + step.
        """
        from model_core.generate.reading import writing_attention

        return writing_attention(self.core, self._position(step), how, layer, head)  # type: ignore[arg-type]

    def attention_on_text(self, step: int, how: str = "head", layer: int = 0, head: int = 0) -> TextView:
        """``attention_weights`` drawn on the text itself (``attention_text_html``)."""
        position = self._position(step)
        weights = self.attention_weights(step, how, layer, head)
        return TextView(attention_text_html(self._texts, weights, position, self.reply_start))

    def candidates(self, step: int) -> pd.DataFrame:
        """The model's top next-token candidates when it wrote reply token ``step``, best first, with their
        probabilities (before temperature and top-p), and whether each is the token it wrote."""
        import pandas as pd

        g = self.generation
        i = self._position(step) - self.reply_start
        return pd.DataFrame({"token": list(g.candidate_strings[i]), "id": g.candidate_ids[i].tolist(),
                             "probability": g.candidate_probs[i].astype(float).tolist(),
                             "written": (g.candidate_ids[i] == g.new_ids[i]).tolist()})


def generate(prompt: str, chat: bool = True, max_new_tokens: int = 48, *, model: str | None = None,
             sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
             device: str | None = None) -> GeneratedTrace:
    """Generate a reply through the one forward route and trace the whole sequence (prompt and reply).

    Args:
        prompt: the question (with ``chat``, the user's message in the model's chat template) or the text to
            continue.
        chat: wrap the prompt in the chat template (the bundled SmolLM2-135M-Instruct has one).
        max_new_tokens: the most new tokens; the reply ends earlier at an end-of-sequence token (kept).
        model: a decoder's hub id or folder; default the bundled SmolLM2-135M-Instruct (offline).
        sample, temperature, top_p, seed: sampling (default greedy: transformers' ``generate(do_sample=False)``).
        device: "auto", "cpu", "cuda" or "mps".

    Raises:
        ValueError: an empty prompt, no chat template, an encoder, settings out of range, or no room left.
        model_core.ModelLoadError: the model cannot be loaded.
    """
    from model_core.generate.generation import DecodingOptions
    from model_core.generate.generation import generate as generate_reply
    from model_core.trace.request import TraceRequest, build_trace
    from model_core.trace.resolve import resolve

    options = DecodingOptions(max_new_tokens=max_new_tokens, sample=sample, temperature=temperature, top_p=top_p,
                              seed=seed)
    model_id = model or BUNDLED_DECODER_ID
    resolved = resolve(TraceRequest("pretrained", "", model_id=model_id), device=device)
    result = generate_reply(resolved, prompt, chat=chat, options=options)
    core = build_trace(result.request(model_id), device=resolved.device, settings=resolved.settings,
                       models=resolved.models)
    return GeneratedTrace(core, result, token_texts(resolved.tokenizer, result.token_ids), model_id)

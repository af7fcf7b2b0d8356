"""Run either model once on a sentence (pair) and collect an AttentionTrace."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from model_core.bert_weights import custom_from_bert
from model_core.config import EncoderConfig
from model_core.encoder import TransformerForSequenceClassification, build_random_model
from model_core.loading import LoadedModel, load_pretrained, load_tokenizer
from model_core.settings import HARD_MAX_TOKENS, Settings, load_settings
from model_core.trace import AttentionTrace

DEFAULT_TEXT_A = "time flies like an arrow"
DEFAULT_TEXT_B = "fruit flies like a banana"
MAX_TEXT_CHARS = 20_000


class InputError(ValueError):
    """The text cannot be traced; the message says what to change."""


@dataclass(frozen=True)
class EncodedInput:
    """A tokenised sentence (pair) for a batch of one.

    Shape: input_ids, token_type_ids: (1, pos).
    """

    tokens: tuple[str, ...]
    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    sentence_b_start: int | None
    truncated: bool = False


def _clean(text: str | None) -> str:
    """Drop control, zero-width and lone surrogate characters; they carry nothing a tokenizer keeps."""
    text = text or ""
    # Cs: a lone surrogate (e.g. from a malformed URL) makes the Rust tokenizer raise TypeError.
    return "".join(c for c in text if not (unicodedata.category(c) in ("Cc", "Cf", "Cs") and c not in "\t\n")).strip()


def encode(
    tokenizer: Any,
    text: str,
    text_b: str | None = None,
    *,
    max_tokens: int = HARD_MAX_TOKENS,
    truncate: bool = False,
) -> EncodedInput:
    """Tokenise with BERT's WordPiece: [CLS] A [SEP] (B [SEP]), token types 0 then 1.

    Raises:
        InputError: empty text, text that gives no tokens, or more than ``max_tokens`` tokens
            without ``truncate``.
    """
    if len(text or "") + len(text_b or "") > MAX_TEXT_CHARS:
        raise InputError(f"The text has {len(text or '') + len(text_b or '')} characters; the limit is "
                         f"{MAX_TEXT_CHARS}. Paste a shorter passage.")
    a, b = _clean(text), _clean(text_b)
    if not a:
        if b:
            raise InputError("Sentence A is empty; type sentence A (sentence B is optional).")
        raise InputError("The text is empty; type a sentence.")
    full = tokenizer(a, b or None, add_special_tokens=True, truncation=False)
    n = len(full["input_ids"])
    # Words per sentence, without [CLS]/[SEP]: e.g. only combining accents, which uncased BERT
    # strips, leave none, and there is nothing to attend to.
    all_types = full.get("token_type_ids") or [0] * n
    n_words_b = all_types.count(1) - 1 if b else 0
    for name, words in (("Sentence A", n - (3 if b else 2) - n_words_b), ("Sentence B", n_words_b if b else 1)):
        if words <= 0:
            raise InputError(f"{name} gives no tokens the model knows (only accents, marks or spaces); "
                             "type some words.")
    truncated = False
    if n > max_tokens:
        if not truncate:
            raise InputError(f"The input has {n} tokens; the limit is {max_tokens}. Shorten it, "
                             "or ask for truncation to keep the first tokens.")
        full = tokenizer(a, b or None, add_special_tokens=True, truncation=True, max_length=max_tokens)
        truncated = True
    ids = full["input_ids"]
    types = full.get("token_type_ids") or [0] * len(ids)
    tokens = tuple(tokenizer.convert_ids_to_tokens(ids))
    b_start = types.index(1) if b and 1 in types else None
    return EncodedInput(
        tokens=tokens,
        input_ids=torch.tensor([ids], dtype=torch.long),
        token_type_ids=torch.tensor([types], dtype=torch.long),
        sentence_b_start=b_start,
        truncated=truncated,
    )


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _head_mask_tensor(head_mask: np.ndarray | None, n_layers: int, n_heads: int, device: torch.device):
    if head_mask is None:
        return None
    hm = np.asarray(head_mask, dtype=np.float32)
    if hm.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask has shape {hm.shape}; it must be (layer, head) = ({n_layers}, {n_heads}).")
    return torch.from_numpy(hm).to(device)


def value_norms(values: torch.Tensor, output_weights: list[torch.Tensor]) -> torch.Tensor:
    """‖v_j W_Oʰ‖: each value after its head's column block of the output projection (Kobayashi et al. 2020).

    Args:
        values: Shape: (layer, head, pos, d_head).
        output_weights: one output projection per layer, ``nn.Linear`` layout. Shape: (hidden, hidden).

    Shape: -> (layer, head, pos).
    """
    n_layers, n_heads, _, d_head = values.shape
    w_o = torch.stack(output_weights)  # (layer, hidden_out, hidden_in); columns h*d_head.. belong to head h
    w_o = w_o.view(n_layers, -1, n_heads, d_head).permute(0, 2, 3, 1)  # (layer, head, d_head, hidden_out)
    # ‖v W‖² = v (W Wᵀ) vᵀ: a d_head x d_head Gram matrix per head instead of every value projected to
    # the hidden size (at 512 tokens and bert-base shape a 226 MB intermediate; this is 3x faster and
    # within 1e-6 relative of it).
    gram = torch.matmul(w_o, w_o.transpose(-1, -2))  # (layer, head, d_head, d_head)
    return (torch.matmul(values, gram) * values).sum(-1).clamp_min(0).sqrt()


@torch.no_grad()
def trace_custom(
    model: TransformerForSequenceClassification,
    encoded: EncodedInput,
    description: str,
    head_mask: np.ndarray | None = None,
) -> AttentionTrace:
    """Run the from-scratch encoder and keep its tensors."""
    device = next(model.parameters()).device
    cfg = model.config
    gate = _head_mask_tensor(head_mask, cfg.num_hidden_layers, cfg.num_attention_heads, device)
    out = model(encoded.input_ids.to(device), encoded.token_type_ids.to(device), head_mask=gate)
    enc = out.encoder
    n_layers, n_heads = len(enc.layers), len(enc.layers[0].heads)

    def stack(pick) -> torch.Tensor:
        """One tensor of every head's ``pick``, copied once (a nested stack would copy it twice)."""
        flat = torch.stack([pick(h) for layer in enc.layers for h in layer.heads])  # (layer * head, ...)
        return flat.view(n_layers, n_heads, *flat.shape[1:])

    queries = stack(lambda h: h.query[0])  # (layer, head, pos, d_head)
    keys = stack(lambda h: h.key[0])
    values = stack(lambda h: h.value[0])
    weights = stack(lambda h: h.step.weights[0])  # (layer, head, q_pos, k_pos)
    n = encoded.input_ids.shape[1]
    mask = np.ones((n, n), dtype=bool) if enc.mask is None else _np(enc.mask[0]) > 0.5
    norms = value_norms(values, [layer.attention.output_linear.weight for layer in model.encoder.layers])
    return AttentionTrace(
        tokens=encoded.tokens,
        token_ids=encoded.input_ids[0].numpy().astype(np.int64),
        token_type_ids=encoded.token_type_ids[0].numpy().astype(np.int64),
        sentence_b_start=encoded.sentence_b_start,
        attentions=_np(weights),
        mask=mask,
        queries=_np(queries),
        keys=_np(keys),
        values=_np(values),
        value_norms=_np(norms),
        hidden_states=_np(torch.stack([h[0] for h in enc.hidden_states])),
        model_kind="custom",
        causal=cfg.causal,
        description=description,
        logits=_np(out.logits[0]),
        head_mask=None if head_mask is None else np.asarray(head_mask, dtype=bool),
    )


@torch.no_grad()
def trace_bert(loaded: LoadedModel, encoded: EncodedInput, head_mask: np.ndarray | None = None) -> AttentionTrace:
    """Run ``transformers``' BertModel and keep its tensors.

    The pre-softmax scores are rebuilt exactly from the queries and keys, which forward hooks
    capture on the query and key projections. transformers 5 dropped BERT's ``head_mask``
    argument, so switching heads off is a hook on each self-attention that zeroes a head's
    output, as the old ``head_mask`` did by zeroing its weights.
    """
    model = loaded.model
    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    d_head = cfg.hidden_size // n_heads
    gate = _head_mask_tensor(head_mask, n_layers, n_heads, loaded.device)
    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def keep(i: int, name: str):
        def hook(_module, _inputs, output):
            captured[(i, name)] = output[0].view(-1, n_heads, d_head).transpose(0, 1)  # (head, pos, d_head)
        return hook

    def gate_heads(i: int):
        def hook(_module, _inputs, output):
            context = output[0]  # (B, pos, hidden)
            scale = gate[i].repeat_interleave(d_head).to(context.dtype)
            return (context * scale, *output[1:])
        return hook

    try:
        for i, layer in enumerate(model.encoder.layer):
            for name in ("query", "key", "value"):
                handles.append(getattr(layer.attention.self, name).register_forward_hook(keep(i, name)))
            if gate is not None:
                handles.append(layer.attention.self.register_forward_hook(gate_heads(i)))
        out = model(
            input_ids=encoded.input_ids.to(loaded.device),
            token_type_ids=encoded.token_type_ids.to(loaded.device),
            output_attentions=True,
            output_hidden_states=True,
        )
    finally:
        for h in handles:
            h.remove()
    if not out.attentions or out.attentions[0] is None:
        raise RuntimeError("The model returned no attentions; it must be loaded with attn_implementation='eager'.")
    attentions = torch.stack([a[0] for a in out.attentions])  # (layer, head, q_pos, k_pos)
    if gate is not None:
        attentions = attentions * gate[:, :, None, None]
    pick = lambda name: torch.stack([captured[(i, name)] for i in range(n_layers)])  # noqa: E731
    values = pick("value")
    norms = value_norms(values, [layer.attention.output.dense.weight for layer in model.encoder.layer])
    n = encoded.input_ids.shape[1]
    return AttentionTrace(
        tokens=encoded.tokens,
        token_ids=encoded.input_ids[0].numpy().astype(np.int64),
        token_type_ids=encoded.token_type_ids[0].numpy().astype(np.int64),
        sentence_b_start=encoded.sentence_b_start,
        attentions=_np(attentions),
        mask=np.ones((n, n), dtype=bool),
        queries=_np(pick("query")),
        keys=_np(pick("key")),
        values=_np(values),
        value_norms=_np(norms),
        hidden_states=_np(torch.stack([h[0] for h in out.hidden_states])),
        model_kind="bert",
        causal=False,
        description=loaded.description,
        logits=None,
        head_mask=None if head_mask is None else np.asarray(head_mask, dtype=bool),
    )


@dataclass(frozen=True)
class CustomSpec:
    """What identifies one custom encoder: its shape, options and weights.

    ``weights="pretrained"`` takes the shape of ``model_id``'s BERT and forces post-LayerNorm.
    """

    weights: Literal["random", "pretrained"] = "random"
    seed: int = 0
    causal: bool = False
    norm_placement: Literal["pre", "post"] = "pre"
    num_layers: int = 12
    num_heads: int = 12
    hidden_size: int = 768
    model_id: str | None = None

    def __post_init__(self) -> None:
        if self.weights not in ("random", "pretrained"):
            raise ValueError(f"weights must be 'random' or 'pretrained', got {self.weights!r}.")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be between 0 and {2**32 - 1}, got {self.seed}.")
        if self.weights == "random":
            self.config()  # validates the shape

    def config(self) -> EncoderConfig:
        """The encoder's config for random weights (intermediate size 4x hidden, as in BERT)."""
        return EncoderConfig(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=4 * self.hidden_size,
            norm_placement=self.norm_placement,
            causal=self.causal,
        )


def build_custom_model(spec: CustomSpec, device: torch.device | str = "cpu") -> TransformerForSequenceClassification:
    """Build the custom encoder a spec describes, on ``device``, in eval mode."""
    if spec.weights == "pretrained":
        loaded = load_pretrained(spec.model_id, device="cpu")
        model = custom_from_bert(loaded.model, seed=spec.seed, causal=spec.causal)
    else:
        model = build_random_model(spec.config(), spec.seed)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval()


def describe_custom(spec: CustomSpec, model: TransformerForSequenceClassification) -> str:
    """One line naming the custom encoder's weights and shape."""
    c = model.config
    weights = (f"BERT weights from {spec.model_id or 'the bundled model'}" if spec.weights == "pretrained"
               else f"random weights, seed {spec.seed}")
    return (f"Custom encoder ({weights}; {c.num_hidden_layers} layers x {c.num_attention_heads} heads, hidden "
            f"{c.hidden_size}, {c.norm_placement}-LayerNorm, {'causal' if c.causal else 'bidirectional'})")


def build_trace(
    model: Literal["custom", "bert"] = "bert",
    text: str = DEFAULT_TEXT_A,
    text_b: str | None = None,
    *,
    weights: Literal["random", "pretrained"] = "random",
    model_id: str | None = None,
    causal: bool = False,
    seed: int = 0,
    norm_placement: Literal["pre", "post"] = "pre",
    num_layers: int = 12,
    num_heads: int = 12,
    hidden_size: int = 768,
    head_mask: np.ndarray | None = None,
    truncate: bool = False,
    device: str | None = None,
    settings: Settings | None = None,
) -> AttentionTrace:
    """One call from text to trace, for either model (loads models as needed; no UI caching).

    Raises:
        InputError: the text cannot be traced.
        ModelLoadError: the pretrained model cannot be loaded.
        ValueError: an option is out of range.
    """
    settings = settings or load_settings()
    if model == "bert":
        loaded = load_pretrained(model_id, device=device, settings=settings)
        limit = min(settings.max_tokens, loaded.model.config.max_position_embeddings)
        encoded = encode(loaded.tokenizer, text, text_b, max_tokens=limit, truncate=truncate)
        return trace_bert(loaded, encoded, head_mask)
    if model != "custom":
        raise ValueError(f"model must be 'custom' or 'bert', got {model!r}.")
    spec = CustomSpec(weights=weights, seed=seed, causal=causal, norm_placement=norm_placement,
                      num_layers=num_layers, num_heads=num_heads, hidden_size=hidden_size,
                      model_id=model_id if weights == "pretrained" else None)
    custom = build_custom_model(spec, "cpu" if device is None else device)
    tokenizer = load_tokenizer(spec.model_id)
    encoded = encode(tokenizer, text, text_b, max_tokens=min(settings.max_tokens, custom.config.max_position_embeddings),
                     truncate=truncate)
    return trace_custom(custom, encoded, describe_custom(spec, custom), head_mask)

"""Tiny real decoder models for tests: a byte-level BPE tokenizer and seeded random GPT-2 / Llama-like models.

Everything is built locally (no hub downloads) and deterministically: the tokenizer is trained on the
paragraphs below, written by the team for these tests, and each model takes seeded random weights whose
query and key projections are scaled up so that attention patterns are far from uniform (a test that
compares patterns can then fail).
"""

from __future__ import annotations

from pathlib import Path

# Written for these tests; the words of the texts the tests trace (time, flies, arrow, fruit, banana,
# bank, river) appear often enough to become whole tokens.
CORPUS = """\
Time flies like an arrow, and fruit flies like a banana. The old sentence is a favourite of people who
study language, because the same words can be read in two ways. In the first reading, time is the thing
that flies. In the second reading, the flies are small insects that like to eat fruit.

A reader solves the puzzle by looking at the words around each word. A model that reads text does the
same thing with attention: every token looks at the tokens before it and decides which of them matter.
Some heads look at the previous token, some look at the first token, and some look for a word that was
seen before in the text.

We walked along the river bank in the morning. The water was calm and the birds were singing in the
trees. Later we went to the bank in the town to pay for a new boat. The word bank can mean the side of a
river or a place that keeps money, and only the other words tell the two apart.

The cat sat on the mat and watched the flies near the window. The dog slept by the door. When the sun
came out, the children ran to the garden to play, and the cat followed them slowly. A banana and an
apple were on the table, next to a cup of tea.

Language models are trained to predict the next token. Given the start of a sentence, the model gives
a probability to every token in its vocabulary. The tokens with the highest probability are the most
likely next words, and a good model puts the right word near the top of the list.
"""

SPECIAL_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 400

# GPT-2 and the Llama-like families the app reads (model_type names). The later ones each bring one more
# quirk: Qwen3 and Gemma-3 normalise each head's q and k before the rotation; Gemma-2 and -3 scale scores
# by query_pre_attn_scalar, and Gemma-2 soft-caps them; Gemma-3 rotates local and global layers with
# different bases; Phi rotates part of each head inside the attention and projects out through `dense`.
FAMILIES = ("gpt2", "llama", "qwen2", "gemma", "mistral", "phi3", "qwen3", "gemma2", "gemma3_text", "phi")
# Whether the family's tokenizer puts a BOS in front of every text, as the real ones do.
ADDS_BOS = {"gpt2": False, "llama": True, "qwen2": False, "gemma": True, "mistral": True, "phi3": False,
            "qwen3": False, "gemma2": True, "gemma3_text": True, "phi": False}

NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = {"gpt2": 4, "llama": 2, "qwen2": 2, "gemma": 1, "mistral": 2, "phi3": 2,
                "qwen3": 2, "gemma2": 2, "gemma3_text": 1, "phi": 4}
HIDDEN = 64
HEAD_DIM = 16
GEMMA_HIDDEN = 48  # Gemma's heads are wider than hidden / heads (4 x 16 = 64 > 48)
QUERY_PRE_ATTN_SCALAR = 24  # Gemma-2/3 scale scores by this**-0.5, not by d_head**-0.5 (16)
MAX_POSITIONS = 128
QK_STD = 0.25  # std of the query/key projection weights (transformers initialises 0.02: near-uniform)
BIAS_STD = 0.1  # biases, where a family has them, are random too, so a trace that forgets them fails


def tiny_tokenizer(folder: Path, add_bos: bool = False):
    """Train a byte-level BPE tokenizer on ``CORPUS`` and save it into ``folder``.

    Word starts carry "Ġ" as in GPT-2; "<|endoftext|>" (id 0) is BOS, EOS and padding.

    Args:
        folder: where ``save_pretrained`` writes; ``AutoTokenizer.from_pretrained(folder)`` loads it.
        add_bos: put "<|endoftext|>" in front of every encoded text, as Llama's tokenizer does.

    Returns:
        The ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[SPECIAL_TOKEN], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    special_id = tok.token_to_id(SPECIAL_TOKEN)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{SPECIAL_TOKEN} $A", pair=f"{SPECIAL_TOKEN} $A $B:1",
            special_tokens=[(SPECIAL_TOKEN, special_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL_TOKEN, eos_token=SPECIAL_TOKEN,
                                      pad_token=SPECIAL_TOKEN, add_bos_token=add_bos)
    Path(folder).mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(folder)
    return wrapped


def _config(family: str, vocab_size: int, special_id: int):
    """The transformers config of one tiny family (2 layers, 4 query heads, eager attention)."""
    import transformers

    # No pad_token_id in the model: a Llama-like embedding zeroes the pad row, and the pad token is also BOS.
    ids = dict(bos_token_id=special_id, eos_token_id=special_id, pad_token_id=None)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab_size, n_positions=MAX_POSITIONS, n_embd=HIDDEN,
                                       n_layer=NUM_LAYERS, n_head=NUM_HEADS, **ids)
    shared = dict(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                  num_hidden_layers=NUM_LAYERS, num_attention_heads=NUM_HEADS,
                  num_key_value_heads=NUM_KV_HEADS[family], head_dim=HEAD_DIM,
                  max_position_embeddings=MAX_POSITIONS, **ids)
    if family == "llama":
        return transformers.LlamaConfig(**shared)
    if family == "qwen2":  # q/k/v projections with biases
        return transformers.Qwen2Config(**shared)
    # Gemma's heads are wider than hidden/heads (real Gemma-7B: 16 x 256 = 4096 > 3072), so the
    # projections are not square; the embeddings are scaled by sqrt(hidden); RMSNorm weights are 1 + w.
    gemma = {**shared, "hidden_size": GEMMA_HIDDEN, "intermediate_size": 2 * GEMMA_HIDDEN}
    if family == "gemma":
        return transformers.GemmaConfig(**gemma)
    if family == "mistral":  # the sliding window covers every position: plain causal attention
        return transformers.MistralConfig(**shared, sliding_window=MAX_POSITIONS)
    if family == "phi3":
        # One fused qkv_proj; half of each head rotary (as Phi-4-mini, which rotates 3/4), to catch a
        # trace that rotates the whole head.
        return transformers.Phi3Config(**shared, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    if family == "qwen3":
        return transformers.Qwen3Config(**shared)
    if family == "gemma2":  # attn_logit_softcapping stays at its real value, 50
        return transformers.Gemma2Config(**gemma, query_pre_attn_scalar=QUERY_PRE_ATTN_SCALAR,
                                         sliding_window=MAX_POSITIONS)
    if family == "gemma3_text":
        return transformers.Gemma3TextConfig(**gemma, query_pre_attn_scalar=QUERY_PRE_ATTN_SCALAR,
                                             sliding_window=MAX_POSITIONS,
                                             layer_types=["sliding_attention", "full_attention"])
    if family == "phi":  # MHA; biases everywhere; half of each head rotary (the default)
        shared.pop("head_dim")
        return transformers.PhiConfig(**shared)
    raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}.")


def _sharpen(model) -> None:
    """Scale the query/key projections up (and randomise biases) so attention is far from uniform."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in ("q_norm", "k_norm")):
                # Qwen3/Gemma-3 normalise q and k per head, which undoes the scaling below: double their gain
                # (RMSNorm weights w, or Gemma's 1 + w, grow by about 1).
                param.add_(1.0 + 0.1 * torch.randn_like(param))
                continue
            if not any(part in name for part in ("q_proj", "k_proj", "qkv_proj", "c_attn", "v_proj", "o_proj")):
                continue
            if name.endswith("bias"):
                param.normal_(0.0, BIAS_STD)
            elif "c_attn" in name:  # GPT-2's Conv1D is (in, out): columns [0, 2*hidden) are q and k
                param[:, : 2 * HIDDEN].normal_(0.0, QK_STD)
            elif any(part in name for part in ("q_proj", "k_proj")):
                param.normal_(0.0, QK_STD)
            elif "qkv_proj" in name:  # Phi-3's rows: q (heads * d_head), then k and v (kv_heads * d_head)
                n_qk = (NUM_HEADS + NUM_KV_HEADS["phi3"]) * HEAD_DIM
                param[:n_qk].normal_(0.0, QK_STD)


def build_tiny_decoder(family: str, folder: Path) -> Path:
    """Build one tiny decoder with seeded random weights and save it, tokenizer included, into ``folder``.

    Loads with ``AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")`` and
    ``AutoTokenizer.from_pretrained(folder)``.

    Args:
        family: one of ``FAMILIES``.
        folder: the folder to write (created if missing).

    Returns:
        ``folder``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}.")
    folder = Path(folder)
    tokenizer = tiny_tokenizer(folder, add_bos=ADDS_BOS[family])
    config = _config(family, len(tokenizer), tokenizer.convert_tokens_to_ids(SPECIAL_TOKEN))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    _sharpen(model)
    model.save_pretrained(folder, safe_serialization=True)
    return folder

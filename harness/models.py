"""Small real model folders made offline, for the image test and the tests of what it ships."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_tiny_bert(folder: Path) -> None:
    """A tiny random BERT (2 layers x 2 heads) with the bundled model's tokenizer: a real model folder, made offline."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from model_core.models.loading import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path()), local_files_only=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    shutil.rmtree(folder, ignore_errors=True)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

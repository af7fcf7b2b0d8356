"""Models of real shapes, without weights: the published configs' shape fields (HuggingFaceTB/SmolLM2-135M-Instruct,
meta-llama/Llama-3.2-1B, Qwen/Qwen2.5-1.5B, meta-llama/Llama-3.1-8B), for ``AutoConfig.for_model`` and a
``from_config`` model of random weights. The size tests (tests/test_big_shapes.py) and the GPU bench
(bench/bench_gpu.py) read the one table."""

from __future__ import annotations

from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=500000.0),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=1000000.0),
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         tie_word_embeddings=False, max_position_embeddings=131072, rope_theta=500000.0),
}

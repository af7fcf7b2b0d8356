"""Generation and what a compressed KV cache keeps."""

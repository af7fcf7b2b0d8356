"""Step-by-step walks: through one layer of an encoder (chapter 3) and one block of a Llama-like decoder."""

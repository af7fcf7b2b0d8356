"""The atlas's names, shared by its torch-free readers and its scan."""

PROFILE_KEYS = ("offset_0", "offset_-1", "offset_-2", "offset_-3", "offset_further", "first_token", "punctuation",
                "entropy_bits", "same_token", "induction")
"""The profile's entries, in the order of the sums' last axis."""
ROW_KEYS = PROFILE_KEYS[:8]
"""Means over every real query row; ``same_token`` over the rows with another copy of their token, ``induction`` over
the rows with an earlier copy."""
N_PROFILE = len(PROFILE_KEYS)
DECODER_MIN_QUERY = 4
"""A decoder's query at a position below this sees few keys, so its weights are large by construction: top contexts
skip it."""
LISTS = ("all", "no_sink")
"""The two lists of top contexts: every key, and keys other than the first token (the sink)."""

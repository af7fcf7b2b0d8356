"""Which attention matters: the contribution graph, direct logit attribution, activation patching."""

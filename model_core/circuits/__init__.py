"""Circuits across a dataset: datasets of prompt pairs (``datasets``), the edge graph and its circuits (``graph``),
faithfulness and its areas (``faithfulness``), the result (``result``), and mean patching over the pairs
(``mean_patching``)."""

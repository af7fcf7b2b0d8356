"""Writing numbers out: the NPZ/JSON export of a trace and the one CSV writer."""

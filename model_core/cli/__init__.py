"""The command line, one verb a module; ``python -m model_core`` dispatches to them."""

"""The error a model load raises: its own leaf module, so ``loading`` and ``bundled`` both import it without a cycle."""


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says why and what to do."""

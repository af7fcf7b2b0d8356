"""Getting a model: loading any family, the bundled models, the device, memory limits and load errors."""

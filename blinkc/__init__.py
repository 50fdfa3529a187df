"""blinkc: the CLI and Python API; the one place that wires ir, models, codegen and runtime together."""

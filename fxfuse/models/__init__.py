"""Reference models bundled with fxfuse (random weights from a config, no downloads)."""

"""Data files shipped in the package (read with `importlib.resources`, never written)."""

"""Where results live: local paths or URLs, the run-dir layout, output-dir checks."""

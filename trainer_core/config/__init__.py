"""Typed configuration: the run's sections, YAML loading, CLI parsing, the size table."""

"""Checkpoints: listing (no torch), keep policy, RNG state, safe loading, saving."""

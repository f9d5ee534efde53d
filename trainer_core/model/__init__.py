"""The transformer, its attention kernel choice, and its parameter and FLOP counts."""

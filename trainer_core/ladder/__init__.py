"""Ladder planning (no Ray): formulas, the per-size plan, memory, records, sweeps."""

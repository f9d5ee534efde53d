"""Tests that need a CUDA GPU (marker ``cuda``; ``make gpu-check`` runs them).

Collected only where ``torch.cuda.is_available()``: on a CPU machine their files are ignored, so
a CPU run neither runs nor skips them (``make test`` reports no skips).
"""

from __future__ import annotations

import torch

collect_ignore_glob = [] if torch.cuda.is_available() else ["test_*.py"]

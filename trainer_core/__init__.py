"""rayladder's training library: plain PyTorch, no Ray (the Ray layer lives in ``trainer_core.ray``)."""

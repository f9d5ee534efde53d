"""The training loop: trainer, train module, optimizer, LR schedules, callbacks, tracking."""

"""Process groups, the device mesh, and wrapping a model for FSDP2/TP/compile/float8."""

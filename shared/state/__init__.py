"""Thread state: the one accessor to checkpoints (SPEC §6)."""

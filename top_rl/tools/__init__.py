"""The commands beside the run: export, the parity probe, scoring, and their shared `key=value` arguments."""

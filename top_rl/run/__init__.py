"""A run's life on disk: checkpoints and their manifest, the run lock, atomic writes, RNG state, fault injection,
safe loading, and what a full disk looks like."""

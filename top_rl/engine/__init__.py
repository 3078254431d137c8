"""What every rollout engine is to the rest of TOP-RL (interface.py): the driver, the weight transports and the eval
see an engine only through it; the engines themselves live in top_rl/rollout/."""

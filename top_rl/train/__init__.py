"""Megatron-core trainer with the model family's TOP layer spec (log-probs bitwise equal to the engine's).

    from top_rl.train import Trainer, TrainerSettings, TrainSequence
    trainer = Trainer(arch_config, TrainerSettings(tp=1, dtype="bfloat16"))   # arch: the family's Config
    trainer.load_hf(path_or_hf_state_dict)
    lps = trainer.logprobs([TrainSequence(tokens, prompt_len, temperature=None)])
    metrics = trainer.train_step(batch, loss_fn)      # loss_fn(list[Tensor], list[int]) -> Tensor
    engine.load_named_tensors({name: t.cpu() for name, t in trainer.iter_hf_weights()})

Files: trainer (API), rl_step (the RL step, gate in the training forward), layers (seam modules; the family's
GPTModel + layer spec is top_rl/train/qwen3_megatron.py), logprobs (engine
formula from hidden states), batch (TrainSequence, micro-batching, THD packing), schedule (pipeline
send/recv), optim (CPU AdamW / Megatron optimizer), weights (TP shards; HF names: the family), parallel (groups,
spawn), recompute (non-reentrant checkpoint), ulysses (context parallelism), cpu_shims (no-CUDA), layout_rules (the
tp/pp/cp a model allows, checked before Ray starts).
"""

from top_rl.config.trainer import TrainerConfig, TrainerSettings
from top_rl.train.sequence import TrainSequence


def __getattr__(name: str):
    # The Trainer pulls in Megatron-core (seconds of import); the driver and Hydra only need the config.
    if name in ("Trainer", "LossFn"):
        from top_rl.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'top_rl.train' has no attribute {name!r}")

__all__ = ["LossFn", "TrainSequence", "Trainer", "TrainerConfig", "TrainerSettings"]

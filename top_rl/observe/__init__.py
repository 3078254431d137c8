"""What a run tells its user: metrics and wandb (tracking), wandb history on resume, third-party noise kept quiet."""

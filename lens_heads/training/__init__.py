"""Training language models: the loop, its settings and schedules, the token windows, checkpoints, the offline corpus and the objectives."""

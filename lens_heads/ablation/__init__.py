"""Intervening on heads: HeadAblation on hook_z, zero or mean (hooks); the random baseline's draws (random_draws); frozen, serialisable ablation specs (specs)."""

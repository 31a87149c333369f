"""Intervening on heads: HeadAblation on hook_z, zero or mean (hooks); frozen, serialisable ablation specs (specs)."""

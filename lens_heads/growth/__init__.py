"""Inheritune (inherit, grow, stack, the baselines' warm starts and the run), on the authors' GPT-2."""

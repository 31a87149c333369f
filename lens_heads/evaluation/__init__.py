"""Running tasks through a model: log-likelihood evaluation (evaluate), greedy generation (generate), and the fast paths under them (prefix, fused_attention, packed_weights, batching)."""

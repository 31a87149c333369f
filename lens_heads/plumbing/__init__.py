"""Plumbing every layer uses: atomic writes (io), the keyed store of resumable results (cache), command-line settings (settings), torchrun / job-array sharding (distributed)."""

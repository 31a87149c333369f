"""Attention collapse: the approximate rank of attention (lazy layers), measured once or as a model trains."""

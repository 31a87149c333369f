"""Attention collapse and Inheritune: approximate attention rank (rank), the offline training corpus (corpus), training (train), the authors' GPT-2 (gpt2), inherit/grow/stack (inheritune)."""

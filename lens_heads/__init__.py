"""lens_heads: find inactive attention heads and lazy layers, prove it by ablation, build smaller models."""

from lens_heads.models import DEFAULT_MODEL, ModelUnavailableError, load_model, tiny_model, weight_basis

__all__ = ["DEFAULT_MODEL", "ModelUnavailableError", "load_model", "tiny_model", "weight_basis"]

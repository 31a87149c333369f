"""lens_heads: find inactive attention heads and lazy layers, prove it by ablation, build smaller models."""

from lens_heads.models import DEFAULT_MODEL, ModelUnavailableError, load_model, tiny_model, weight_basis
from lens_heads.tasks import Item, Task, load_task

__all__ = ["Item", "Task", "load_task", "DEFAULT_MODEL", "ModelUnavailableError", "load_model", "tiny_model", "weight_basis"]

"""Model and training specifications, the model registry and the plan file."""

from meshplan.specs.model import ModelSpec
from meshplan.specs.registry import resolve_model, list_models

__all__ = ["ModelSpec", "resolve_model", "list_models"]

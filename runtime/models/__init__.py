"""Model providers behind one interface."""

from runtime.models.base import ModelError, ModelProvider, StepAnswer, StepRequest

__all__ = ["ModelError", "ModelProvider", "StepAnswer", "StepRequest"]

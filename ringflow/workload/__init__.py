"""LLM training at cluster scale as a model: specs, layouts, traffic, memory, step time, planner."""
from __future__ import annotations

from .models import ModelSpec, load_model, preset_names

__all__ = ["ModelSpec", "load_model", "preset_names"]

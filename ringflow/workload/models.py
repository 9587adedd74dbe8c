"""Transformer model specs as data: presets from models/*.yaml or a user's YAML/JSON file.

Parameter counts and FLOPs per token are computed from the dimensions (nothing is typed in):

- attention per layer: Q and O projections ``2 h^2``, K and V ``2 h h_kv`` (h_kv = kv_heads x head_dim);
- MLP per layer: ``2 h f`` (GELU) or ``3 h f`` (gated SwiGLU), times ``experts`` for MoE (+ router ``h E``);
- biases and norms: ``norm_params`` per norm (LayerNorm 2h, RMSNorm h), two norms per layer;
- embeddings ``V h`` (twice when input and output embeddings are untied) + learned positions ``s h``.

For the Megatron GPT family this is exactly Narayanan et al. (2021) Eq. 2,
``12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))`` (plus the final LayerNorm), and Llama-3-70B comes to 70.55e9.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InvalidArgument

_PRESET_DIR = Path(__file__).with_name("models")
_REQUIRED = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (dense or mixture-of-experts)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int = 2048
    experts: int = 1
    top_k: int = 1
    gated_mlp: bool = True
    norm: str = "rmsnorm"
    bias: bool = False
    tied_embeddings: bool = False
    position: str = "rope"
    dropout: bool = False
    nominal_params: float = 0.0  # the size in the model's name (70e9 for Llama-3-70B); 0 = use params()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "nominal_params", float(self.nominal_params))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model {self.name!r}: nominal_params={self.nominal_params!r} is not a number",
                              "write it as e.g. 70e9") from exc
        for f in _REQUIRED + ("seq_len", "experts", "top_k"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name!r}: {f}={v!r} must be a positive integer",
                                  f"set {f} to a whole number > 0 in the model file")
        if self.hidden % self.heads:
            raise ConfigError(f"model {self.name!r}: hidden={self.hidden} is not a multiple of heads={self.heads}",
                              "hidden must equal heads x head_dim")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: heads={self.heads} not a multiple of kv_heads={self.kv_heads}",
                              "grouped-query attention needs heads divisible by kv_heads")
        if self.top_k > self.experts:
            raise ConfigError(f"model {self.name!r}: top_k={self.top_k} > experts={self.experts}",
                              "top_k must be <= experts")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ConfigError(f"model {self.name!r}: norm={self.norm!r}", "use rmsnorm or layernorm")
        if self.position not in ("rope", "learned"):
            raise ConfigError(f"model {self.name!r}: position={self.position!r}", "use rope or learned")

    # ---- dimensions -------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.experts > 1

    # ---- parameters --------------------------------------------------------------------------------------------
    def attention_params(self) -> int:
        """Weights (+ biases) of one attention block."""
        h, kv = self.hidden, self.kv_hidden
        w = 2 * h * h + 2 * h * kv
        return w + ((h + 2 * kv + h) if self.bias else 0)

    def expert_params(self) -> int:
        """Weights (+ biases) of one MLP (one expert)."""
        h, f = self.hidden, self.ffn_hidden
        if self.gated_mlp:
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    def norm_params(self) -> int:
        """Parameters of one normalisation layer."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_params(self) -> int:
        """All parameters of one transformer layer (every expert counted)."""
        router = self.hidden * self.experts if self.is_moe else 0
        return self.attention_params() + self.experts * self.expert_params() + router + 2 * self.norm_params()

    def active_layer_params(self) -> int:
        """Parameters one token touches in one layer (top_k experts for MoE)."""
        router = self.hidden * self.experts if self.is_moe else 0
        return self.attention_params() + self.top_k * self.expert_params() + router + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Input (+ untied output) embeddings and learned positions."""
        e = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return e + (self.seq_len * self.hidden if self.position == "learned" else 0)

    def params(self) -> int:
        """Total parameter count."""
        return self.layers * self.layer_params() + self.embedding_params() + self.norm_params()

    def active_params(self) -> int:
        """Parameters used per token (== params() for dense models)."""
        return self.layers * self.active_layer_params() + self.embedding_params() + self.norm_params()

    # ---- FLOPs -------------------------------------------------------------------------------------------------
    def layer_matmul_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one layer for one token (2 per multiply-add, active experts only)."""
        h, kv, f = self.hidden, self.kv_hidden, self.ffn_hidden
        attn = 2 * (2 * h * h + 2 * h * kv)
        mlp = 2 * (3 if self.gated_mlp else 2) * h * f * self.top_k
        router = 2 * h * self.experts if self.is_moe else 0
        return float(attn + mlp + router)

    def layer_attention_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs of QK^T and AV for one token of one layer (full, non-causal count as in Megatron)."""
        return float(4 * seq_len * self.hidden)

    def logit_flops_per_token(self) -> float:
        """Forward FLOPs of the output (logit) layer per token."""
        return float(2 * self.hidden * self.vocab)

    def forward_flops_per_token(self, seq_len: int | None = None) -> float:
        """Forward FLOPs per token of the whole model."""
        s = seq_len or self.seq_len
        per_layer = self.layer_matmul_flops_per_token() + self.layer_attention_flops_per_token(s)
        return self.layers * per_layer + self.logit_flops_per_token()

    def training_flops_per_token(self, seq_len: int | None = None) -> float:
        """Model FLOPs per token of one training step: forward + backward = 3 x forward (the MFU numerator)."""
        return 3.0 * self.forward_flops_per_token(seq_len)

    def nominal(self) -> float:
        """The size in the model's name if given (what the closed-form traffic formulas use), else params()."""
        return self.nominal_params or float(self.params())

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (the YAML/JSON schema)."""
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """Spec plus derived counts, for printing."""
        return {**self.to_dict(), "params": self.params(), "active_params": self.active_params(),
                "training_flops_per_token": self.training_flops_per_token()}


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict[str, Any]]:
    import yaml
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(_PRESET_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for name, spec in data.items():
            out[str(name)] = dict(spec)
    return out


def preset_names() -> list[str]:
    """Names of the bundled model presets."""
    return sorted(_presets())


def spec_from_dict(d: dict[str, Any], name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from a dict, checking required and unknown keys."""
    if not isinstance(d, dict):
        raise ConfigError(f"model spec {name!r} is not a mapping", "give keys layers, hidden, heads, ...")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ConfigError(f"model spec {name!r} lacks {', '.join(missing)}",
                          f"a model file needs at least: {', '.join(_REQUIRED)} (and experts, top_k for MoE)")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"model spec {name!r} has unknown keys {unknown}", f"known keys: {sorted(known)}")
    d = dict(d)
    d.setdefault("name", name)
    if "kv_heads" not in d:
        d["kv_heads"] = d["heads"]
    return ModelSpec(**d)


def load_model(spec: str | dict[str, Any] | ModelSpec) -> ModelSpec:
    """A preset name ('llama3-70b'), a YAML/JSON file path, a dict, or a ModelSpec."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, dict):
        return spec_from_dict(spec, str(spec.get("name", "custom")))
    key = str(spec).strip()
    presets = _presets()
    if key.lower() in presets:
        return spec_from_dict(presets[key.lower()], key.lower())
    if os.path.exists(key):
        try:
            text = Path(key).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read model file {key!r}: {exc}",
                              "give a readable YAML/JSON model file") from None
        try:
            if key.endswith(".json"):
                data = json.loads(text)
            else:
                import yaml
                data = yaml.safe_load(text)
        except Exception as exc:  # yaml/json parse errors have many types
            raise ConfigError(f"cannot parse model file {key}: {exc}", "check the YAML/JSON syntax") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"model file {key!r} does not hold a mapping of model fields",
                              "write the model as YAML/JSON keys (layers, hidden, heads, ...)")
        return spec_from_dict(data, Path(key).stem)
    raise InvalidArgument(f"unknown model {spec!r}",
                          f"use a preset ({', '.join(preset_names())}) or a YAML/JSON file path")

"""Transformer model specs as data: presets from models/*.yaml or a user's YAML/JSON file.

Parameter counts and FLOPs per token are computed from the dimensions (nothing is typed in):

- attention per layer (``d`` = head_dim, given or hidden / heads): Q ``h a d``, K and V ``h k d`` each
  (k = kv_heads: grouped-query attention), O ``a d h``; ``qk_norm`` adds two head_dim norms. Multi-head latent
  attention (DeepSeek-V2/V3, ``kv_lora_rank > 0``): Q down ``h q_r`` + norm + up ``q_r a (n + r)`` (or one
  ``h a (n + r)`` without ``q_lora_rank``), KV down ``h (c + r)`` + norm + up ``c a (n + v)``, O ``a v h``
  (c = kv_lora_rank, n = qk_nope_head_dim, r = qk_rope_head_dim, v = v_head_dim);
- MLP per layer: ``2 h f`` (GELU) or ``3 h f`` (gated SwiGLU). Mixture of experts: ``experts`` routed experts of
  ``expert_ffn_hidden`` each (default ffn_hidden), ``shared_experts`` always-on experts of the same size, a
  router ``h E``; the first ``dense_layers`` layers are dense with ``ffn_hidden`` (DeepSeek-V3: 3);
- biases and norms: ``norm_params`` per norm (LayerNorm 2h, RMSNorm h), two norms per layer;
- embeddings ``V h`` (twice when input and output embeddings are untied) + learned positions ``s h``
  (+ a LayerNorm after the embedding with ``embedding_norm``, BLOOM).

Forward FLOPs per token: 2 per multiply-add of every matmul weight a token touches (top_k + shared experts),
plus the attention scores ``2 s_eff a (d_qk + d_v)`` per layer, counted non-causally as Megatron does
(s_eff = s); a layer with a sliding window w < s attends ``2 w - w^2 / s`` positions on that count (the causal
average ``w - w^2 / (2 s)``, doubled like the full count). For the Megatron GPT family this is exactly
Narayanan et al. (2021) Eq. 2 and 3; Llama-3-70B comes to 70.55e9 parameters.
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
_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "vocab")
_MLA_FIELDS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
POSITIONS = ("rope", "learned", "alibi", "none")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (dense or mixture-of-experts; MHA, GQA or MLA attention)."""

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
    head_dim: int = 0            # 0: hidden / heads (Qwen3 gives 128 with hidden / heads != 128)
    qk_norm: bool = False        # a norm of head_dim on Q and on K (Qwen3)
    kv_lora_rank: int = 0        # > 0: multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int = 0         # MLA: rank of the Q compression (0 = Q projected directly)
    qk_rope_head_dim: int = 0    # MLA: rotary part of each Q/K head
    qk_nope_head_dim: int = 0    # MLA: non-rotary part of each Q/K head
    v_head_dim: int = 0          # MLA: size of each V head
    sliding_window: int = 0      # > 0: attention window in tokens (Mistral 7B: 4096)
    global_every: int = 0        # with a window: every n-th layer attends globally (Gemma 2: 2); 0 = none
    expert_ffn_hidden: int = 0   # MoE: FFN size of one routed/shared expert (0 = ffn_hidden)
    shared_experts: int = 0      # MoE: experts every token goes through (DeepSeek-V3: 1)
    dense_layers: int = 0        # MoE: the first n layers are dense with ffn_hidden (DeepSeek-V3: 3)
    embedding_norm: bool = False  # a norm right after the input embedding (BLOOM)
    node_limit: int = 0          # MoE: servers a token's experts may span (DeepSeek-V3: 4); 0 = no limit
    source: str = ""             # where the dimensions come from (paper, config.json URL)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "nominal_params", float(self.nominal_params))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model {self.name!r}: nominal_params={self.nominal_params!r} is not a number",
                              "write it as e.g. 70e9") from exc
        for f in _REQUIRED + ("kv_heads", "seq_len", "experts", "top_k"):
            _check_int(self.name, f, getattr(self, f), 1)
        for f in ("head_dim", "kv_lora_rank", "q_lora_rank", "sliding_window", "global_every",
                  "expert_ffn_hidden", "shared_experts", "dense_layers") + _MLA_FIELDS:
            _check_int(self.name, f, getattr(self, f), 0)
        self._check_attention()
        if self.top_k > self.experts:
            raise ConfigError(f"model {self.name!r}: top_k={self.top_k} > experts={self.experts}",
                              "top_k must be <= experts")
        if not self.is_moe and (self.shared_experts or self.dense_layers or self.expert_ffn_hidden):
            raise ConfigError(f"model {self.name!r}: shared_experts / dense_layers / expert_ffn_hidden on a "
                              "dense model", "set experts > 1 (and top_k) for a mixture of experts")
        if self.dense_layers >= self.layers:
            raise ConfigError(f"model {self.name!r}: dense_layers={self.dense_layers} >= layers={self.layers}",
                              "dense_layers counts the dense layers before the first MoE layer")
        if self.global_every and not self.sliding_window:
            raise ConfigError(f"model {self.name!r}: global_every without sliding_window",
                              "give the window size (sliding_window) or drop global_every")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ConfigError(f"model {self.name!r}: norm={self.norm!r}", "use rmsnorm or layernorm")
        if self.position not in POSITIONS:
            raise ConfigError(f"model {self.name!r}: position={self.position!r}", f"use one of {', '.join(POSITIONS)}")

    def _check_attention(self) -> None:
        if self.kv_lora_rank:
            missing = [f for f in _MLA_FIELDS if not getattr(self, f)]
            if missing:
                raise ConfigError(f"model {self.name!r}: multi-head latent attention (kv_lora_rank) lacks "
                                  f"{', '.join(missing)}", "give qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
            object.__setattr__(self, "kv_heads", self.heads)  # every head gets its own K and V
        elif self.q_lora_rank or any(getattr(self, f) for f in _MLA_FIELDS):
            raise ConfigError(f"model {self.name!r}: q_lora_rank / qk_*_head_dim / v_head_dim are "
                              "multi-head latent attention fields", "set kv_lora_rank too, or remove them")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ConfigError(f"model {self.name!r}: hidden={self.hidden} is not a multiple of "
                                  f"heads={self.heads}", "hidden must equal heads x head_dim, or give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: heads={self.heads} not a multiple of kv_heads={self.kv_heads}",
                              "grouped-query attention needs heads divisible by kv_heads")

    # ---- dimensions -------------------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Size of one Q (and K) head: head_dim, or nope + rope parts under MLA."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """Size of one V head."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def q_width(self) -> int:
        """Width of Q: heads x qk_head_dim."""
        return self.heads * self.qk_head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of K: kv_heads x qk_head_dim (V: kv_heads x v_dim)."""
        return self.kv_heads * self.qk_head_dim

    @property
    def v_width(self) -> int:
        """Width of V (and of the attention output before O): kv_heads x v_dim, heads x v_dim."""
        return self.kv_heads * self.v_dim

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.experts > 1

    @property
    def moe_ffn(self) -> int:
        """FFN size of one expert."""
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """True if layer `index` (0-based) is a mixture-of-experts layer."""
        return self.is_moe and index >= self.dense_layers

    def window_of(self, index: int) -> int:
        """Attention window of layer `index` (0 = full attention)."""
        if not self.sliding_window or (self.global_every and (index + 1) % self.global_every == 0):
            return 0
        return self.sliding_window

    # ---- parameters --------------------------------------------------------------------------------------------
    def attention_matmul_params(self) -> int:
        """Matmul weights of one attention block (what FLOPs count)."""
        h, a = self.hidden, self.heads
        if self.is_mla:
            qk = self.qk_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * a * qk) if self.q_lora_rank else h * a * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
                self.kv_lora_rank * a * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + a * self.v_head_dim * h
        return h * self.q_width + h * self.kv_hidden + h * self.v_width + self.heads * self.v_dim * h

    def attention_params(self) -> int:
        """Weights, biases and inner norms of one attention block."""
        w = self.attention_matmul_params()
        per_norm = 2 if self.norm == "layernorm" else 1
        if self.is_mla:
            w += per_norm * (self.kv_lora_rank + self.q_lora_rank)  # norms on the compressed latents
        if self.qk_norm:
            w += 2 * per_norm * self.qk_head_dim
        if self.bias:
            w += self.q_width + self.kv_hidden + self.v_width + self.hidden
        return w

    def expert_params(self, ffn: int | None = None) -> int:
        """Weights (+ biases) of one MLP of size `ffn` (default: one expert's)."""
        h, f = self.hidden, ffn or self.moe_ffn
        if self.gated_mlp:
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    def mlp_matmul_params(self, ffn: int) -> int:
        """Matmul weights of one MLP of size `ffn`."""
        return (3 if self.gated_mlp else 2) * self.hidden * ffn

    def norm_params(self) -> int:
        """Parameters of one normalisation layer."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def router_params(self) -> int:
        """Router weights of one MoE layer."""
        return self.hidden * self.experts if self.is_moe else 0

    def routed_expert_params(self) -> int:
        """All routed experts of one MoE layer (what expert parallelism splits)."""
        return self.experts * self.expert_params() if self.is_moe else 0

    def layer_params(self, index: int | None = None) -> int:
        """All parameters of layer `index` (default: an MoE layer of an MoE model), every expert counted."""
        base = self.attention_params() + 2 * self.norm_params()
        if not self._moe(index):
            return base + self.expert_params(self.ffn_hidden)
        return base + (self.experts + self.shared_experts) * self.expert_params() + self.router_params()

    def active_layer_params(self, index: int | None = None) -> int:
        """Parameters one token touches in layer `index` (top_k + shared experts for MoE)."""
        base = self.attention_params() + 2 * self.norm_params()
        if not self._moe(index):
            return base + self.expert_params(self.ffn_hidden)
        return base + (self.top_k + self.shared_experts) * self.expert_params() + self.router_params()

    def _moe(self, index: int | None) -> bool:
        return self.is_moe if index is None else self.is_moe_layer(index)

    def embedding_params(self) -> int:
        """Input (+ untied output) embeddings, learned positions and an embedding norm."""
        e = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        e += self.seq_len * self.hidden if self.position == "learned" else 0
        return e + (self.norm_params() if self.embedding_norm else 0)

    def params(self) -> int:
        """Total parameter count."""
        dense = self.layers - self.moe_layers
        layers = dense * self.layer_params(0 if self.dense_layers or not self.is_moe else None) + \
            self.moe_layers * self.layer_params(self.layers - 1)
        return layers + self.embedding_params() + self.norm_params()

    def active_params(self) -> int:
        """Parameters used per token (== params() for dense models)."""
        dense = self.layers - self.moe_layers
        layers = dense * self.active_layer_params(0 if self.dense_layers or not self.is_moe else None) + \
            self.moe_layers * self.active_layer_params(self.layers - 1)
        return layers + self.embedding_params() + self.norm_params()

    # ---- FLOPs -------------------------------------------------------------------------------------------------
    def layer_matmul_flops_per_token(self, index: int | None = None) -> float:
        """Forward matmul FLOPs of layer `index` for one token (2 per multiply-add, active experts only)."""
        attn = self.attention_matmul_params()
        if self._moe(index):
            mlp = (self.top_k + self.shared_experts) * self.mlp_matmul_params(self.moe_ffn) + self.router_params()
        else:
            mlp = self.mlp_matmul_params(self.ffn_hidden)
        return 2.0 * (attn + mlp)

    def layer_expert_flops_per_token(self, index: int | None = None) -> float:
        """The routed-expert share of `layer_matmul_flops_per_token` (what a capacity factor pads)."""
        return 2.0 * self.top_k * self.mlp_matmul_params(self.moe_ffn) if self._moe(index) else 0.0

    def attended_positions(self, seq_len: int, index: int = 0) -> float:
        """Key positions per query on Megatron's non-causal count: s, or 2w - w^2/s with a window w < s."""
        w = self.window_of(index)
        if not w or w >= seq_len:
            return float(seq_len)
        return 2.0 * w - w * w / seq_len

    def layer_attention_flops_per_token(self, seq_len: int, index: int | None = None) -> float:
        """Forward FLOPs of QK^T and AV for one token of layer `index` (default: the mean over layers)."""
        per_pos = 2.0 * self.heads * (self.qk_head_dim + self.v_dim)
        if index is None:
            return per_pos * sum(self.attended_positions(seq_len, i) for i in range(self.layers)) / self.layers
        return per_pos * self.attended_positions(seq_len, index)

    def logit_flops_per_token(self) -> float:
        """Forward FLOPs of the output (logit) layer per token."""
        return float(2 * self.hidden * self.vocab)

    def span_flops_per_token(self, seq_len: int, start: int, stop: int) -> tuple[float, float, float]:
        """(matmul, attention, routed-expert) forward FLOPs per token of layers start..stop-1."""
        return _span_flops(self, seq_len, start, stop)

    def forward_flops_per_token(self, seq_len: int | None = None) -> float:
        """Forward FLOPs per token of the whole model."""
        mm, attn, _ = self.span_flops_per_token(seq_len or self.seq_len, 0, self.layers)
        return mm + attn + self.logit_flops_per_token()

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


def _check_int(name: str, field: str, v: Any, least: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        kind = "a positive integer" if least else "an integer >= 0"
        raise ConfigError(f"model {name!r}: {field}={v!r} must be {kind}",
                          f"set {field} to a whole number {'> 0' if least else '>= 0'} in the model file")


@lru_cache(maxsize=4096)
def _span_flops(model: ModelSpec, seq_len: int, start: int, stop: int) -> tuple[float, float, float]:
    mm = attn = ex = 0.0
    for i in range(start, stop):
        mm += model.layer_matmul_flops_per_token(i)
        attn += model.layer_attention_flops_per_token(seq_len, i)
        ex += model.layer_expert_flops_per_token(i)
    return mm, attn, ex
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

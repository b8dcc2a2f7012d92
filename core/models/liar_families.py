"""Model families described as data: the one place that says where a family's prunable pieces live.

Loading, surgery, export, the web app's model picker and the recipe checks all read this table. The
file imports nothing but the standard library, so the web process can read it without torch, and it
is copied beside ``modeling_liar.py`` into every checkpoint with bundled code (which imports it
relatively), so a pruned model loads where this project is not installed.

Adding a LLaMA-like family is one entry in ``FAMILIES``: its Hugging Face ``model_type`` values, the
module paths of one block, and the transformers class names its checkpoints use.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """Where the prunable pieces of one transformer block live (paths relative to the block)."""

    name: str
    kind: str  # "decoder" | "encoder"
    model_types: tuple[str, ...]  # Hugging Face config.model_type values of this family
    layers: str  # path from ``model.base_model`` to the ModuleList of blocks
    attn: str  # attention module whose head-count attributes change
    q: str
    k: str
    v: str
    o: str  # attention output projection: its *input* channels are pruned
    ffn_in: tuple[str, ...]  # FFN projections whose *output* rows are pruned
    ffn_out: str  # FFN output projection: its *input* channels are pruned
    ffn_block: str  # module computing the FFN (``ffn_out`` included or not)
    gqa: bool  # key/value heads may be fewer than query heads (LLaMA family)
    config_class: str  # transformers class names: the config, and the models per Auto class
    model_classes: dict[str, str] = field(default_factory=dict)
    # Stock-config flags that switch a bias on for the attention / FFN projections, when the
    # architecture has them; None means an added bias cannot be expressed in the stock config.
    attn_bias_flag: str | None = None
    mlp_bias_flag: str | None = None
    head_dim_in_config: bool = True  # False for BERT: head size is hidden_size / num_heads
    # Norms whose output feeds only the attention / the FFN block (pre-norm architectures): while a
    # pruned block is replayed from stored inputs, its input norm is skipped as well. None: no such norm.
    attn_input_norm: str | None = None
    ffn_input_norm: str | None = None
    final_norm: str | None = None  # path from ``model.base_model`` to the norm after the last block


_DECODER = dict(
    kind="decoder",
    layers="layers",
    attn="self_attn",
    q="self_attn.q_proj",
    k="self_attn.k_proj",
    v="self_attn.v_proj",
    o="self_attn.o_proj",
    ffn_in=("mlp.gate_proj", "mlp.up_proj"),
    ffn_out="mlp.down_proj",
    ffn_block="mlp",
    gqa=True,
    attn_input_norm="input_layernorm",
    ffn_input_norm="post_attention_layernorm",
    final_norm="norm",
)

FAMILIES: dict[str, Family] = {
    "llama": Family(
        name="llama",
        model_types=("llama",),
        config_class="LlamaConfig",
        model_classes={"AutoModelForCausalLM": "LlamaForCausalLM", "AutoModel": "LlamaModel"},
        attn_bias_flag="attention_bias",
        mlp_bias_flag="mlp_bias",
        **_DECODER,
    ),
    "mistral": Family(
        name="mistral",
        model_types=("mistral",),
        config_class="MistralConfig",
        model_classes={"AutoModelForCausalLM": "MistralForCausalLM"},
        **_DECODER,
    ),
    "qwen2": Family(
        name="qwen2",
        model_types=("qwen2",),
        config_class="Qwen2Config",
        model_classes={"AutoModelForCausalLM": "Qwen2ForCausalLM"},
        **_DECODER,
    ),
    "bert": Family(
        name="bert",
        kind="encoder",
        model_types=("bert",),
        layers="encoder.layer",
        attn="attention.self",
        q="attention.self.query",
        k="attention.self.key",
        v="attention.self.value",
        o="attention.output.dense",
        ffn_in=("intermediate.dense",),
        ffn_out="output.dense",
        ffn_block="intermediate",
        gqa=False,
        head_dim_in_config=False,
        config_class="BertConfig",
        model_classes={
            "AutoModel": "BertModel",
            "AutoModelForSequenceClassification": "BertForSequenceClassification",
            "AutoModelForQuestionAnswering": "BertForQuestionAnswering",
        },
    ),
}

PRUNED_PREFIX = "liar_"  # model_type of a checkpoint whose layers have different widths


def family_of(model_type: str | None) -> Family | None:
    """The family of a Hugging Face ``model_type`` (a stock one, or a pruned ``liar_<family>``)."""
    mt = str(model_type or "")
    if mt.startswith(PRUNED_PREFIX):
        return FAMILIES.get(mt[len(PRUNED_PREFIX) :])
    return next((f for f in FAMILIES.values() if mt in f.model_types), None)


def supported_model_types() -> list[str]:
    """The stock ``model_type`` values the engine prunes, sorted."""
    return sorted(mt for f in FAMILIES.values() for mt in f.model_types)

"""Model families described as data: the one place that says where a family's prunable pieces live.

Loading, surgery, export, the web app's model picker and the recipe checks all read this table. The
file imports nothing but the standard library, so the web process can read it without torch, and it
is copied beside ``modeling_liar.py`` into every checkpoint with bundled code (which imports it
relatively), so a pruned model loads where this project is not installed.

Adding a LLaMA-like family is one entry in ``FAMILIES``: its Hugging Face ``model_type`` values, the
module paths of one block, and the transformers class names its checkpoints use. The other fields say
how a family departs from LLaMA: fused projections (Phi-3), norms around the attention and the FFN
(Gemma's sandwich norms), head counts read from the config or kept as attributes (Phi-3, OPT, BERT),
an FFN written inline in the block (OPT). ``docs/design.md`` walks through adding one, with the test
template every family passes.
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
    # Norms applied to the attention's / the FFN's *output* before it joins the residual stream
    # (Gemma's sandwich norms): an error in o_proj's or the FFN's output reaches the residual scaled
    # by their gain. None: the output is added as it is.
    attn_output_norm: str | None = None
    ffn_output_norm: str | None = None
    # q, k and v are consecutive row blocks of one projection (Phi-3's ``qkv_proj``; q, k and v then
    # name that one path), and likewise gate and up of ``ffn_in[0]`` (Phi-3's ``gate_up_proj``)
    qkv_fused: bool = False
    ffn_in_fused: bool = False
    # the attention's forward splits or reshapes by the *config's* head counts (Phi-3): a pruned block
    # then sees a per-layer view of the config carrying its own counts
    heads_from_config: bool = False
    # attention attributes holding the number of query heads / their total width, kept in step with
    # pruning (BERT's ``num_attention_heads`` / ``all_head_size``, OPT's ``num_heads``); the key/value
    # head count attribute ``num_key_value_heads`` is updated wherever the attention has one
    head_count_attrs: tuple[str, ...] = ()
    head_width_attrs: tuple[str, ...] = ()
    # a module applied between the FFN input and output projections *outside* ``ffn_block`` (OPT's
    # ``activation_fn``, whose FFN is written inline in the block): a replay of the block bypasses it
    ffn_inline_act: str | None = None
    ffn_width_key: str = "intermediate_size"  # config key of the FFN width (OPT: ``ffn_dim``)
    label: str = ""  # the family's name for people (messages, the model picker); default ``name``


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

# Gemma's sandwich norms: ``post_attention_layernorm`` normalises the attention's *output*,
# ``post_feedforward_layernorm`` the FFN's; the FFN's input norm is ``pre_feedforward_layernorm``
_SANDWICH = {
    **_DECODER,
    "ffn_input_norm": "pre_feedforward_layernorm",
    "attn_output_norm": "post_attention_layernorm",
    "ffn_output_norm": "post_feedforward_layernorm",
}

FAMILIES: dict[str, Family] = {
    "llama": Family(
        name="llama",
        label="LLaMA",
        model_types=("llama",),
        config_class="LlamaConfig",
        model_classes={"AutoModelForCausalLM": "LlamaForCausalLM", "AutoModel": "LlamaModel"},
        attn_bias_flag="attention_bias",
        mlp_bias_flag="mlp_bias",
        **_DECODER,
    ),
    "mistral": Family(
        name="mistral",
        label="Mistral",
        model_types=("mistral",),
        config_class="MistralConfig",
        model_classes={"AutoModelForCausalLM": "MistralForCausalLM"},
        **_DECODER,
    ),
    "qwen2": Family(
        name="qwen2",
        label="Qwen2",
        model_types=("qwen2",),
        config_class="Qwen2Config",
        model_classes={"AutoModelForCausalLM": "Qwen2ForCausalLM"},
        **_DECODER,
    ),
    # per-head q/k RMSNorms act on each head's head_dim channels with weights shared by all heads:
    # nothing of theirs is sliced when heads go
    "qwen3": Family(
        name="qwen3",
        label="Qwen3",
        model_types=("qwen3",),
        config_class="Qwen3Config",
        model_classes={"AutoModelForCausalLM": "Qwen3ForCausalLM"},
        attn_bias_flag="attention_bias",
        **_DECODER,
    ),
    "gemma2": Family(
        name="gemma2",
        label="Gemma 2",
        model_types=("gemma2",),
        config_class="Gemma2Config",
        model_classes={"AutoModelForCausalLM": "Gemma2ForCausalLM"},
        attn_bias_flag="attention_bias",
        **_SANDWICH,
    ),
    "gemma3": Family(
        name="gemma3",
        label="Gemma 3 (text)",
        model_types=("gemma3_text",),
        config_class="Gemma3TextConfig",
        model_classes={"AutoModelForCausalLM": "Gemma3ForCausalLM"},
        attn_bias_flag="attention_bias",
        **_SANDWICH,
    ),
    "phi3": Family(
        name="phi3",
        label="Phi-3",
        model_types=("phi3",),
        config_class="Phi3Config",
        model_classes={"AutoModelForCausalLM": "Phi3ForCausalLM"},
        qkv_fused=True,
        ffn_in_fused=True,
        heads_from_config=True,
        **{
            **_DECODER,
            "q": "self_attn.qkv_proj",
            "k": "self_attn.qkv_proj",
            "v": "self_attn.qkv_proj",
            "ffn_in": ("mlp.gate_up_proj",),
        },
    ),
    # OPT: multi-head attention with biases everywhere, learned positions, the FFN inline in the block
    # (fc1 → activation_fn → fc2); its norms may come after the sub-layers (opt-350m), so none is
    # skipped during a replay
    "opt": Family(
        name="opt",
        label="OPT",
        kind="decoder",
        model_types=("opt",),
        layers="decoder.layers",
        attn="self_attn",
        q="self_attn.q_proj",
        k="self_attn.k_proj",
        v="self_attn.v_proj",
        o="self_attn.out_proj",
        ffn_in=("fc1",),
        ffn_out="fc2",
        ffn_block="fc1",
        ffn_inline_act="activation_fn",
        gqa=False,
        head_dim_in_config=False,
        head_count_attrs=("num_heads",),
        ffn_width_key="ffn_dim",
        final_norm="decoder.final_layer_norm",
        config_class="OPTConfig",
        model_classes={"AutoModelForCausalLM": "OPTForCausalLM"},
    ),
    "bert": Family(
        name="bert",
        label="BERT",
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
        head_count_attrs=("num_attention_heads",),
        head_width_attrs=("all_head_size",),
        config_class="BertConfig",
        model_classes={
            "AutoModel": "BertModel",
            "AutoModelForSequenceClassification": "BertForSequenceClassification",
            "AutoModelForQuestionAnswering": "BertForQuestionAnswering",
        },
    ),
}

PRUNED_PREFIX = "liar_"  # model_type of older liar_-form checkpoints (newer ones keep the stock type)


def family_of(model_type: str | None) -> Family | None:
    """The family of a Hugging Face ``model_type`` (a stock one, or a pruned ``liar_<family>``)."""
    mt = str(model_type or "")
    if mt.startswith(PRUNED_PREFIX):
        return FAMILIES.get(mt[len(PRUNED_PREFIX) :])
    return next((f for f in FAMILIES.values() if mt in f.model_types), None)


def pools_first_token(architectures: list[str] | None) -> bool:
    """Whether an encoder with these model classes (``config.architectures``, or the loaded model's
    class name) is a sequence classifier, whose head reads only the first ([CLS]) token's final state
    (BERT, RoBERTa, DistilBERT, ... ``*ForSequenceClassification``). Question answering, token
    classification and bare encoders (embeddings) read every position."""
    return any(str(a).endswith("ForSequenceClassification") for a in architectures or [])


def supported_families_text() -> str:
    """One line naming the families the engine prunes, for error messages and the model picker."""
    return ", ".join(f.label or f.name for f in FAMILIES.values())


_MIXTURE_OF_EXPERTS = (
    "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe", "jamba",
    "granitemoe", "phimoe", "gpt_oss", "llama4", "minimax",
)  # fmt: skip
_ENCODER_DECODERS = ("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper", "led", "m2m_100")


def unsupported_reason(model_type: str | None) -> str:
    """One sentence saying why a model type is not pruned, and which families are."""
    mt = str(model_type or "")
    supported = f"supported families: {supported_families_text()}"
    if mt in _MIXTURE_OF_EXPERTS or mt.endswith("_moe"):
        kind = "a mixture-of-experts model, whose expert FFNs this tool does not prune yet"
    elif mt in _ENCODER_DECODERS:
        kind = "an encoder-decoder model, which this tool does not prune"
    elif mt == "gemma3":
        kind = "Gemma 3 with its vision tower; its text model (model_type gemma3_text) is supported"
    else:
        kind = "not a supported architecture"
    return f"model type {mt!r} is {kind} ({supported})"

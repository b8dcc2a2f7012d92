"""The configuration of a pruned checkpoint in vLLM's DeciLM form (``DeciLMForCausalLM``).

Copied beside the weights of every such checkpoint (``auto_map``), so ``vllm serve DIR
--trust-remote-code`` reads it where this project is not installed; it imports only ``transformers``.
vLLM's DeciLM builds each layer from ``block_configs[i]``: ``attention.n_heads_in_group`` (the query
heads per key/value head; the query-head count is the global ``num_attention_heads``) and
``ffn.intermediate_size``. vLLM reads those as attributes, so each entry is a dict whose keys also
read as attributes (and that stays a plain dict in ``config.json``).
"""

from __future__ import annotations

from transformers import PretrainedConfig


class _Fields(dict):
    """A dict whose keys read as attributes (a missing one is an ``AttributeError``, so ``hasattr`` works)."""

    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Fields(value) if isinstance(value, dict) and not isinstance(value, _Fields) else value


class LiarDeciConfig(PretrainedConfig):
    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, **kwargs):
        self.block_configs = [_Fields({k: _Fields(v) for k, v in b.items()}) for b in (block_configs or [])]
        super().__init__(**kwargs)

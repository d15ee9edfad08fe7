"""Typed experiment configuration: the schema, strict loading, and the generated reference.

- `schema`: one dataclass per YAML section; every default and its documentation.
- `ranges`: the valid values of a key (numeric `Range`s, device names) and their checks.
- `load`: YAML files, `--set` overrides, typed conversion with errors that name the key.
- `reference`: the README's table of every key.
"""

from nmt.config.load import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from nmt.config.reference import field_docs, reference_markdown
from nmt.config.schema import (
    CorpusConfig,
    DataConfig,
    DecodeConfig,
    EvalConfig,
    ExperimentConfig,
    ModelConfig,
    RNNConfig,
    TokenizerConfig,
    TrainConfig,
    TransformerConfig,
    expand_vars,
)

__all__ = [
    "CorpusConfig", "DataConfig", "DecodeConfig", "EvalConfig", "ExperimentConfig", "ModelConfig", "RNNConfig",
    "TokenizerConfig", "TrainConfig", "TransformerConfig", "apply_overrides", "config_from_dict", "config_to_dict",
    "expand_vars", "field_docs", "load_config", "reference_markdown", "save_config",
]

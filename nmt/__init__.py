"""nmt: neural machine translation with from-scratch Transformer and attentional RNN models."""

__version__ = "0.1.0"

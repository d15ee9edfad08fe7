"""nmt: neural machine translation with from-scratch Transformer and attentional RNN models.

    from nmt import Sampling, Translator

    translator = Translator.from_checkpoint("best.pt")
    translator.translate(["Ein Mann fährt Fahrrad."], beam=5)
    translator.translate(lines, sampling=Sampling(top_p=0.9, seed=1))

`import nmt` stays light: `Translator`, `Translation` (`nmt.translate`) and
`Sampling` (`nmt.decode`), which need torch, are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Sampling", "Translation", "Translator", "__version__"]

if TYPE_CHECKING:
    from nmt.decode import Sampling
    from nmt.translate import Translation, Translator

_LAZY = {"Translator": "nmt.translate", "Translation": "nmt.translate", "Sampling": "nmt.decode"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")

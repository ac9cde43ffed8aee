"""llmctl: take an LLM training job from raw text to a quantized, servable model on megatron-core.

Importing this package is cheap: it imports no torch, megatron-core, Transformer Engine or
transformers. Those are imported inside the functions that need them.
"""

__version__ = "0.1.0"

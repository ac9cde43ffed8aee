"""Hugging Face interop: import a Hugging Face model directory as a megatron-core checkpoint.

`mapping` holds the one name/shape table that both `llmctl import hf` (here) and
`llmctl export hf` (`llmctl.quant.export`) use; `importer` streams the weights; `init` loads an
imported checkpoint's weights into a fresh run (`checkpoint.init_from`).
"""

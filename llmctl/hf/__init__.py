"""Hugging Face interop, both directions: `llmctl import hf` and `llmctl export hf`.

`mapping` holds the one name/shape table that both `importer` (a Hugging Face directory ->
a megatron-core checkpoint, streaming the weights through `convert`) and `export` (a run's
checkpoint -> a Hugging Face directory) use; `config` maps `config.json` to llmctl's model
config group and back; `modeldir` reads a Hugging Face directory's headers without loading it;
`init` checks an imported checkpoint before it seeds a fresh run (`checkpoint.init_from`).
Nothing here imports `llmctl.quant`: quantization uses this package, not the reverse.
"""

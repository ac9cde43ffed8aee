"""A training run before and around its processes, without torch or megatron-core.

The layout a run trains with, its run directory and files (`launch.json`, `config.yaml`,
`perf.json`, metrics), the run lock, preflight checks, the checkpoint store (commit protocol,
validation, retention, listing) and its compatibility checks, preemption signals and the data
checks. Launchers, the CLI, `hf/` and `quant/` use this package; the in-rank runner
(`llmctl.train`) builds on it. Nothing here imports torch or megatron-core at module level.
"""

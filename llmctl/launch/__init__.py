"""Launchers: render (pure: argv, env, sbatch text), then execute (one function per backend).

Every backend implements one interface (`backend.Backend`: configure, render, check, execute,
status, logs, cancel) and is registered under its `launcher.kind` in `backend.BACKENDS`; it is
imported only when that kind is used:

- `local`: `render_local` -> torchrun on this node; `execute_local` runs it.
- `torchrun`: `render_torchrun_nodes` -> per-node torchrun + ssh wrapping from a hostfile;
  `check_hosts` probes the hosts; `execute_torchrun` runs them.
- `slurm`: `render_sbatch` -> an sbatch script; `execute_slurm` submits it.

`llmctl train` goes through `api.prepare_train` (compose, plan check, layout, render: a
`backend.TrainLaunch`) and `api.execute_train`; `llmctl status|logs` through `jobs`. Nothing
here imports torch.
"""

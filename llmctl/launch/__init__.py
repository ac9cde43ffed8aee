"""Launchers: render (pure: argv, env, sbatch text), then execute (one function per backend).

- `local`: `render_local` -> torchrun on this node; `execute_local` runs it.
- `torchrun`: `render_torchrun_nodes` -> per-node torchrun + ssh wrapping from a hostfile;
  `check_hosts` probes the hosts; `execute_torchrun` runs them.
- `slurm`: `render_sbatch` -> an sbatch script; `execute_slurm` submits it.

`llmctl train` goes through `api.prepare_train` (compose, plan check, layout, render) and
`api.execute_train`. Nothing here imports torch.
"""

from llmctl.launch.hostfile import Host, parse_hostfile, read_hostfile
from llmctl.launch.local import execute_local, render_local, render_local_env
from llmctl.launch.slurm import execute_slurm, render_sbatch
from llmctl.launch.torchrun import NodeCommand, check_hosts, execute_torchrun, render_torchrun_nodes

__all__ = [
    "Host",
    "NodeCommand",
    "check_hosts",
    "execute_local",
    "execute_slurm",
    "execute_torchrun",
    "parse_hostfile",
    "read_hostfile",
    "render_local",
    "render_local_env",
    "render_sbatch",
    "render_torchrun_nodes",
]

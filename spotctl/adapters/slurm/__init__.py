"""Slurm through slurmrestd: pending jobs in, drain / resume / forget out.

The modules, from the payloads up:

- :mod:`.parsing` — what slurmrestd sends, read (numbers and states of every API generation,
  hostlists, TRES strings, a pending job as work units): pure functions.
- :mod:`.scontrol` — ``scontrol`` on this host, run with the same JWT, for what REST does not offer.
- :mod:`.rest` — the slurmrestd client: the token and its checks, API version discovery, requests,
  and what an error answer means (the one rule of :mod:`spotctl.adapters._http`, plus Slurm's own).
- :mod:`.scheduler` — :class:`SlurmScheduler`, the :class:`~spotctl.core.ports.SchedulerPort`.

Configured by a region's ``[regions.R.slurm]`` table (read by ``SlurmScheduler.from_config``)::

    [regions.lab.slurm]
    url = "http://slurm-ctl:6820"       # slurmrestd (auth/jwt)
    user = "spotctl"                     # X-SLURM-USER-NAME
    token_file = "/etc/spotctl/slurm.jwt"  # or token = "...", or token_env = "SLURM_REST_TOKEN"
    # api_version = "v0.0.40"            # pin; default: the newest one served among v0.0.38 .. v0.0.42
    # scontrol = "/usr/bin/scontrol"     # for drain/resume when the REST API cannot update nodes
    # slurm_conf = "/etc/slurm/slurm.conf"
    # node_name = "{node}"               # Slurm NodeName of a spot node (the node agent's slurmd -N / -Z)
    # node_prefix = "spot-"              # spot node ids start with this: those Slurm nodes are ours
    # timeout_seconds = 10
    # verify_tls = true                  # or ca_file = "/etc/ssl/slurm-ca.pem"
    # default_time_limit_seconds = 3600  # expected duration of jobs without a time limit
    # drain_via = "auto"                 # auto | rest | scontrol

Both API generations are tested against real slurmrestds: 22.05 (v0.0.38) and 24.11
(v0.0.40-v0.0.42), scripts/testenv/slurm{,24}.
"""

from __future__ import annotations

from .parsing import array_tasks, expand_hostlist, partition_max_nodes
from .rest import SUPPORTED_VERSIONS, SlurmRest
from .scheduler import SlurmScheduler

__all__ = ["SUPPORTED_VERSIONS", "SlurmRest", "SlurmScheduler", "array_tasks", "expand_hostlist",
           "partition_max_nodes"]

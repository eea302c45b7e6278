"""The Slurm backend moved to ``healthcheck.slurm`` (the health check needs it and may not import
``slurm_hooks``); these names stay importable from here."""
from healthcheck.slurm import CliBackend  # noqa: F401
from healthcheck.slurm import JobInfo  # noqa: F401
from healthcheck.slurm import NodeInfo  # noqa: F401
from healthcheck.slurm import SlurmBackend  # noqa: F401
from healthcheck.slurm import SlurmError  # noqa: F401
from healthcheck.slurm import backend_from_config  # noqa: F401

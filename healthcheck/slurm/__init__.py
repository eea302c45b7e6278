"""Talking to Slurm. ``SlurmBackend`` is the small interface the hooks and the CLI use;
``CliBackend`` implements it with Slurm's own command-line tools (the backend that must
always work: pyslurm has no release for the Slurm 22.05 we test against). A pyslurm
backend could implement the same methods later."""
from .backend import JobInfo, NodeInfo, SlurmBackend, SlurmError  # noqa: F401
from .cli_backend import CliBackend  # noqa: F401


def backend_from_config(config) -> "CliBackend":
    """The Slurm backend a hook or command should use, from ``[slurm]`` in the config."""
    section = config.section("slurm")
    return CliBackend(bin_dir=section.get("bin_dir", ""), slurm_conf=section.get("conf", ""),
                      timeout_s=float(section.get("timeout_s", 15)))

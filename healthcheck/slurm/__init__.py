"""Talking to Slurm. ``SlurmBackend`` is the small interface the hooks, the health check and
the CLI use; ``CliBackend`` implements it with Slurm's own command-line tools (the backend that
must always work; nothing imports pyslurm: docs/install.md "Why not pyslurm"); ``FakeBackend``
(``tests/fake_backend.py``, not installed) implements it in memory for unit tests.

It lives in ``healthcheck`` so the health check, which never imports ``slurm_hooks``, can
drain and resume. Importing this package runs nothing: ``CliBackend`` (which runs programs)
loads on first use, so pure modules may import the data types from here.
"""
from .backend import JobInfo, NodeInfo, SlurmBackend, SlurmError  # noqa: F401


def backend_from_config(config) -> "CliBackend":  # noqa: F821
    """The Slurm backend a hook or command should use, from ``[slurm]`` in the config."""
    from .cli_backend import CliBackend

    from ..config.settings import SlurmSettings

    slurm = config.typed(SlurmSettings)
    return CliBackend(bin_dir=slurm.bin_dir, slurm_conf=slurm.conf, timeout_s=slurm.timeout_s)


def __getattr__(name: str):
    if name == "CliBackend":
        from .cli_backend import CliBackend

        return CliBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

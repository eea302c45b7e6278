"""The Slurm-facing side: prolog, epilog, job-end summaries and the ``slurm-gpu`` admin CLI.

May import ``healthcheck``; ``healthcheck`` never imports this package.
"""
__version__ = "0.1.0"

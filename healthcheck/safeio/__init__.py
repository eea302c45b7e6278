"""Careful I/O for code that runs as root: running another program, writing files,
reading TOML and the package's data files, and the small helpers their state files use.

Imports nothing: each module is imported where it is needed."""

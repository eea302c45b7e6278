"""The node simulator: GPUs at the driver boundary (a pynvml look-alike), InfiniBand as a
sysfs tree and the kernel log as a file, all rendered from a TOML profile."""

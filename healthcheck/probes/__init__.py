"""Probes gather facts and judge nothing: NVML (``nvml``), InfiniBand/RoCE sysfs (``ib_sysfs``),
DCGM diagnostics (``dcgm``), each under a deadline (``deadline``). pynvml is imported lazily."""

"""``slurm-gpu-watch``: a resident watcher that runs the health check as soon as the kernel log
reports a GPU fault (``service``), and the pure rules of when it does (``trigger``)."""

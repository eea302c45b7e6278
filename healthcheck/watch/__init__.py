"""``slurm-gpu-watch``: a resident watcher that runs the health check as soon as the kernel log
reports a GPU fault (``service``) and the pure rules of when it does (``trigger``)."""
import sys

PROG = "slurm-gpu-watch"


def say(message: str) -> None:
    """One line on stderr (journald, or the lab's log file), unprintable characters replaced."""
    text = "".join(ch if ch.isprintable() else "?" for ch in message)
    try:
        sys.stderr.write(f"{PROG}: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass

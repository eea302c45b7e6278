"""What the TaskProlog gives a task: where the node's GPUs and HCAs sit (topology) and the
NCCL environment chosen from it.

Imports nothing: each module is imported where it is needed."""

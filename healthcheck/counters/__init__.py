"""Counter growth over a time window (pure arithmetic) and the state file that keeps the
counter series between runs.

Imports nothing: each module is imported where it is needed."""

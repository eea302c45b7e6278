"""What every hook process shares: the fail-open entry, the whole-run watchdog, no cyclic
garbage collection in a short process, and the journal of hook runs.

Imports nothing: each module is imported where it is needed."""

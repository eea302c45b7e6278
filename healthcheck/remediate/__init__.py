"""Back in service by itself: the remediation decision (plan, pure) and its ledger (state)."""

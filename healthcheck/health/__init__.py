"""The health-check program's parts: its settings (``policy``), what it remembers between runs
(``state``), confirmation and reboot bookkeeping (``tally``), the drain budget (``budget``), one
run composed (``run``) and what it leaves behind (``outputs``). The entry point is
``healthcheck.healthcheck``."""

"""The Xid rules: what an Xid, SXid or fallen-off-the-bus event means and what it asks for.

Pure rules and tables, no reading: ``events`` (the event and its action's rank), ``xid_actions``
(our Xid actions and what each does to a node, from ``data/xid-actions.tsv``), ``catalog``
(NVIDIA's catalog -> our action), ``pci`` (addresses -> GPU index/UUID) and ``event_findings``
(events -> Findings). The checks, the config's validation and the readers in ``kernellog/`` all
take them from here. See docs/kernel-log.md.
"""

"""``slurm-gpu summary``: why jobs ended, which hardware hurt them, which nodes keep doing it.

Accounting rows (``sacct -P``) stream through ``accounting.read_rows`` into one ``Tally``
(``tally.py``), whose memory grows with the number of nodes, causes and hours, never with the
number of jobs. ``classify.py`` decides a row's cause (pure), ``offenders.py`` ranks nodes,
``drains.py`` reads what Slurm says about drained nodes, ``report.py`` turns a finished tally
into the JSON contract, and ``text.py`` / ``csvout.py`` / ``html.py`` present it.
"""

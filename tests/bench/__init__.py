"""`make bench`: pveclean against fuser, lsof and the usual one-liners, on the lab (issue 7).

Entry point: ``python -m tests.bench.run`` (``--quick`` for a tiny smoke run). Modules:
``load`` (thousands of idle host processes from a static C helper), ``measure`` (timing,
peak RSS, NVML readings, machine facts), ``table`` (the result tables as text, Markdown and
JSON), ``discovery`` (discovery and growth), ``cleanup`` (whole cleanup against the seeds'
recipes), ``hooks`` (hookscript overhead).
"""

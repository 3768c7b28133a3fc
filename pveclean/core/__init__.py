"""The pure core: records, discovery merges, the stop policy, verdicts and reports.

No I/O and no clock: it imports nothing outside pveclean.core but pveclean.errors and the
standard library's pure modules (the rule is checked in `make lint`)."""

"""Adapters for the Linux host: /proc, cgroups, device nodes, NVML, pidfds, forked readers,
locks and files. May import pveclean.core and pveclean.errors."""

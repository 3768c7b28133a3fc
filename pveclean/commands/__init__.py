"""The command shells: the CLI, the hook phases, install, status, gpus, reports, and their
rendering. They may import every layer; nothing imports them but the entry point."""

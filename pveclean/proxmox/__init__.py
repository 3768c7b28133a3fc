"""Adapters for Proxmox VE: container configs on /etc/pve, `pct` and the probe it runs, the
API, the hookscript and the systemd drop-in. May import pveclean.core, .host and .errors."""

"""pveclean: stop exactly the GPU holders of one Proxmox LXC container, verify the memory."""

__version__ = "0.1.0"

"""pveclean: stop exactly the GPU holders of one Proxmox LXC container and verify the memory is free."""

__version__ = "0.1.0"

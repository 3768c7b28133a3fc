"""Situations set up in the lab, shared by tests, `make demo` and `make bench`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .lxclab import Lab, Workload

TP_MIB = 18_000
VLLM_MIB = 2_048
NCCL_MIB = 512
OTHER_MIB = 6_000
HOST_MIB = 300


@dataclass
class Seeds:
    """The seeds' situation: what is left in CT `vmid` after its inference service stopped."""

    vmid: int
    workers: list[Workload] = field(default_factory=list)  # four python3 TP workers
    vllm: Workload | None = None
    nccl: Workload | None = None  # ignores SIGTERM
    unrelated: Workload | None = None  # python3 holding no GPU
    other_ct: Workload | None = None  # another container's worker on GPU 0
    host: Workload | None = None  # a host process on GPU 0

    def targets(self) -> list[Workload]:
        assert self.vllm and self.nccl
        return [*self.workers, self.vllm, self.nccl]

    def bystanders(self) -> list[Workload]:
        return [w for w in (self.unrelated, self.other_ct, self.host) if w is not None]


def seeds(lab: Lab, vmid: int, other_vmid: int | None = None, host: bool = True,
          term_delay_ms: int = 0) -> Seeds:
    lab.create_ct(vmid)
    s = Seeds(vmid)
    for gpu in range(4):
        s.workers.append(lab.run_in_ct(
            vmid, "python3", hold=[f"/dev/nvidia{gpu}", "/dev/nvidiactl"], maps=["/dev/nvidia-uvm"],
            gpu_mib={gpu: TP_MIB}, term_delay_ms=term_delay_ms,
            extra_args=["-m", "vllm.worker", f"--rank={gpu}"]))
    s.vllm = lab.run_in_ct(vmid, "vllm-worker", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                           gpu_mib={0: VLLM_MIB}, term_delay_ms=term_delay_ms)
    s.nccl = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidiactl"], maps=["/dev/nvidia-uvm"],
                           ignore_term=True, gpu_mib={1: NCCL_MIB})
    s.unrelated = lab.run_in_ct(vmid, "python3", extra_args=["-m", "http.server"])
    if other_vmid is not None:
        lab.create_ct(other_vmid, gpus=(0,))
        s.other_ct = lab.run_in_ct(other_vmid, "python3", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                                   gpu_mib={0: OTHER_MIB})
    if host:
        s.host = lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])],
                                 gpu_mib={0: HOST_MIB})
    return s

"""The v1 freezer on hybrid hosts (issue 39): a holder the tenant froze in the container's own
v1 freezer cgroup survived every run (SIGKILL waits for a thaw there). What is frozen in the
container's v1 tree is thawed before its tasks are signalled, and said; a v1 cgroup outside
the container's tree is never touched."""

from __future__ import annotations

from pathlib import Path

from pveclean.host import freezer_v1


def v1(root: Path, rel: str, state: str, self_freezing: str) -> Path:
    d = root / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "freezer.state").write_text(state + "\n")
    (d / "freezer.self_freezing").write_text(self_freezing + "\n")
    return d


def task(proc: Path, pid: int, freezer: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"7:freezer:{freezer}\n0::/lxc/129/ns\n")


def test_the_containers_own_frozen_cgroups_are_thawed_and_said(proc: Path,
                                                                tmp_path: Path) -> None:
    root = tmp_path / "freezer"
    v1(root, "/lxc/129", "FROZEN", "0")
    mid = v1(root, "/lxc/129/ns", "FROZEN", "1")  # the tenant froze this level
    low = v1(root, "/lxc/129/ns/jail", "FROZEN", "0")  # frozen through its parent
    outside = v1(root, "/admin-freeze", "FROZEN", "1")
    task(proc, 70, "/lxc/129/ns/jail")
    task(proc, 71, "/admin-freeze")
    task(proc, 72, "/lxc/1290/ns")  # another container's (not /lxc/129/...)
    said = freezer_v1.thaw_in_tree([70, 71, 72, 73], 129, str(root))
    assert said == ["PID 70 was frozen by the v1 freezer cgroup /lxc/129/ns of the container: "
                    "thawed before it was signalled"]
    assert (mid / "freezer.state").read_text() == "THAWED"
    assert (low / "freezer.state").read_text().strip() == "FROZEN"  # the kernel's to update
    assert (outside / "freezer.state").read_text().strip() == "FROZEN"


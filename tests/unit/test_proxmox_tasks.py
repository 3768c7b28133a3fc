"""proxmox/tasks: the Proxmox task above a hook phase, from the workers' titles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pveclean.proxmox import tasks

UPID = "UPID:pve1:0000A1B2:0012C3D4:6750F00D:{type}:129:root@pam:"


@pytest.mark.parametrize(("kind", "kills"), [
    ("vzstop", True), ("vzdestroy", True), ("vzrollback", True), ("vzmtunnel", True),
    ("vzshutdown", False), ("vzreboot", False), ("vzmigrate", False), ("vzdump", False),
    ("hastop", False), ("stopall", False),
])
def test_the_task_type_says_whether_vm_stop_kills(kind: str, kills: bool) -> None:
    task = tasks.parse_upid("task " + UPID.format(type=kind))
    assert task is not None and task.type == kind and task.id == "129"
    assert task.user == "root@pam" and task.kills is kills


@pytest.mark.parametrize("title", [
    "", "perl", "task", "task UPID:", "task UPID:pve1:1:2:3::129:root@pam:",
    "UPID:pve1:0000A1B2:0012C3D4:6750F00D:vzstop:129:root@pam:",  # no "task " prefix
])
def test_other_titles_are_no_task(title: str) -> None:
    assert tasks.parse_upid(title) is None


def test_the_task_is_found_among_the_ancestors() -> None:
    """A worker (argv[0] its title, as Perl's $0 shows it) runs a shell that runs us."""
    title = "task " + UPID.format(type="vzshutdown")
    code = ("import sys; sys.path[:0] = " + repr(sys.path) + "; "
            "from pveclean.proxmox import tasks; t = tasks.running_task(); "
            "print(t.type if t else None)")
    worker = ("import subprocess, sys; "
              f"sys.exit(subprocess.call(['/bin/sh', '-c', {sys.executable!r} + ' -c \"$0\"', "
              f"{code!r}]))")
    out = subprocess.run([title, "-c", worker], executable=sys.executable, capture_output=True,
                         text=True, check=True, env={**os.environ}).stdout
    assert out.strip() == "vzshutdown"
    assert tasks.running_task() is None  # pytest runs in no task

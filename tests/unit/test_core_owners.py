"""core/owners: the one parser of the cgroup paths LXC and Proxmox lay out."""

from __future__ import annotations

import pytest

from pveclean.core.owners import (
    HOST,
    UNKNOWN,
    Layout,
    Owner,
    OwnerKind,
    ct_path,
    in_tree,
    is_ct_dir,
    owner_of,
    place,
    rel_path,
)


@pytest.mark.parametrize(("cgroup", "owner"), [
    ("/lxc/129/ns/init.scope", Owner(OwnerKind.CT, 129)),
    ("/lxc/129", Owner(OwnerKind.CT, 129)),
    ("/lxc.monitor/129", HOST),  # the container's monitor runs on the host
    ("/lxc.payload.130/x", HOST),  # a plain LXC container: no VMID of Proxmox's
    ("/lxc/plain/sub", HOST),
    ("/lxc/12a", HOST),
    ("/system.slice/nvidia-persistenced.service", HOST),
    ("/", HOST),
    (None, UNKNOWN),
])
def test_owner_of(cgroup: str | None, owner: Owner) -> None:
    assert owner_of(cgroup) == owner


def test_place_names_the_tree() -> None:
    assert place("/lxc.monitor/129").layout is Layout.MONITOR
    assert place("/lxc.payload.7").number == 7
    assert place("/user.slice").layout is Layout.NONE


def test_a_containers_paths_and_below() -> None:
    assert ct_path(129) == "/lxc/129" and ct_path(129, "ns/./a.service") == \
        "/lxc/129/ns/a.service"
    assert rel_path("/lxc/129", 129) == "." and rel_path("/lxc/129/ns/x", 129) == "ns/x"
    assert rel_path("/lxc/1290/ns", 129) is None and rel_path(None, 129) is None
    assert in_tree("/lxc/129/ns", 129) and not in_tree("/lxc/1290", 129)
    assert is_ct_dir("129") and not is_ct_dir("plain") and not is_ct_dir("1a")

"""The plan of an install or uninstall (what it would change, and the problems that stop it),
how it reads, and carrying it out: print it, stop at its problems, apply it unless a dry run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.errors import ExitCode


@dataclass(frozen=True)
class InstallRequest:
    """What `pveclean install` is asked: which guests, where the hookscript goes, and how."""

    vmids: tuple[int, ...] = ()  # the guests named
    every: bool = False  # instead: every guest of the kind with GPUs (--all, --all-gpu-vms)
    kind: str = "lxc"  # qemu: VMs (--vm, --all-gpu-vms)
    storage: str = "local"  # the storage whose snippets directory gets the hookscript
    chain: bool = False  # keep another hookscript and run it in every phase (--chain)
    enable_snippets: bool = False  # add 'snippets' to the storage's content
    systemd: bool = False  # a pve-container@VMID.service drop-in too (--systemd)


@dataclass
class Step:
    """One guest's step of an install or uninstall plan."""

    vmid: int
    node: str
    action: str  # set, chain, unchanged, restore, delete, skip
    before: str | None = None  # the hookscript now
    after: str | None = None  # the hookscript it gets
    chained: str | None = None  # the script the hook runs too (install --chain)
    chained_path: str | None = None
    note: str = ""
    digest: str | None = None  # the config's digest when planned: a change since is refused
    kind: str = "lxc"  # qemu: a VM


@dataclass
class Plan:
    """What install or uninstall would do, guest by guest, before it does it."""

    command: str  # install or uninstall
    storage: str | None = None
    file: Path | None = None
    file_action: str = "none"  # create, update, unchanged, keep, none
    text: str = ""
    enable_snippets: list[str] | None = None  # the storage's new content list
    remove_files: list[Path] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    # systemd drop-ins (install --systemd): (vmid, path, create|update|unchanged|remove, text)
    dropins: list[tuple[int, Path, str, str]] = field(default_factory=list)
    problems: list[tuple[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forget_chains: list[int] = field(default_factory=list)  # destroyed containers' records

    def problem(self, message: str, code: int = ExitCode.USAGE) -> None:
        self.problems.append((message, code))

    @property
    def exit_code(self) -> int:
        return max((c for _, c in self.problems), default=0)

    @property
    def changes(self) -> int:
        return (sum(s.action in ("set", "chain", "restore", "delete") for s in self.steps)
                + (self.file_action in ("create", "update")) + bool(self.remove_files)
                + (self.enable_snippets is not None)
                + sum(a != "unchanged" for _, _, a, _ in self.dropins)
                + len(self.forget_chains))


@dataclass
class Outcome:
    """What carrying out a plan did: the steps done and the errors, with exit codes."""

    done: list[str] = field(default_factory=list)
    errors: list[tuple[str, int]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return max((c for _, c in self.errors), default=0)


def describe(plan: Plan) -> list[str]:
    """The plan, one line per thing it does or leaves alone."""
    lines = []
    if plan.enable_snippets is not None:
        lines.append(f"storage '{plan.storage}': add content 'snippets' "
                     f"(content {','.join(plan.enable_snippets)})")
    if plan.file is not None and plan.file_action != "none":
        lines.append(f"{plan.file}: {plan.file_action}")
    for s in plan.steps:
        who = f"{'VM' if s.kind == 'qemu' else 'CT'} {s.vmid} ({s.node})"
        if s.action == "set":
            extra = f", replacing {s.before}" if s.before else ""
            extra += f"; keeps running {s.chained}" if s.chained else ""
            lines.append(f"{who}: set hookscript {s.after}{extra}")
        elif s.action == "chain":
            lines.append(f"{who}: set hookscript {s.after}; chain {s.chained} "
                         "(pveclean runs it in every phase)")
        elif s.action == "unchanged":
            extra = f" (runs {s.chained} too)" if s.chained else ""
            lines.append(f"{who}: unchanged, hookscript is {s.after}{extra}")
        elif s.action == "restore":
            lines.append(f"{who}: restore hookscript {s.after} (instead of {s.before})")
        elif s.action == "delete":
            lines.append(f"{who}: delete hookscript {s.before}")
        else:
            lines.append(f"{who}: left alone, {s.note}")
    for vmid, path, action, _text in plan.dropins:
        lines.append(f"CT {vmid}: systemd drop-in {path}: {action}")
    lines += [f"CT {vmid}: remove its chain record" for vmid in plan.forget_chains]
    lines += [f"remove {p}" for p in plan.remove_files]
    lines += [f"note: {n}" for n in plan.notes]
    return lines


@dataclass
class Account:
    """What carrying out a plan said: with --json, one object on stdout."""

    command: str
    dry_run: bool
    plan: list[str]
    changes: int
    problems: list[str]
    done: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self, exit_code: int) -> dict[str, object]:
        return {"command": self.command, "dry_run": self.dry_run, "plan": self.plan,
                "changes": self.changes, "problems": self.problems, "done": self.done,
                "errors": self.errors, "exit_code": exit_code}


def carry_out(plan: Plan, dry_run: bool, apply: Callable[[], Outcome],
              echo: Callable[[str, bool], None], as_json: bool = False) -> int:
    """Print the plan; stop at its problems; apply it unless a dry run. Returns the exit code.
    With `as_json` everything is said once, as one JSON object on stdout."""
    said = Account(plan.command, dry_run, describe(plan), plan.changes,
                   [m for m, _ in plan.problems])
    code = _carry_out(plan, dry_run, apply, (lambda _line, _err: None) if as_json else echo,
                      said)
    if as_json:
        echo(json.dumps(said.as_dict(int(code)), indent=2), False)
    return code


def _carry_out(plan: Plan, dry_run: bool, apply: Callable[[], Outcome],
               echo: Callable[[str, bool], None], said: Account) -> int:
    for line in describe(plan):
        echo(line, False)
    for message, _code in plan.problems:
        echo(f"pveclean: {message}", True)
    if plan.problems:
        echo(f"pveclean: nothing changed ({len(plan.problems)} problem(s))", True)
        return plan.exit_code
    if dry_run:
        echo(f"dry run: {plan.changes} change(s) planned, nothing changed", False)
        return ExitCode.OK
    if not plan.changes:
        echo("nothing to change", False)
        return ExitCode.OK
    outcome = apply()
    said.done, said.errors = outcome.done, [m for m, _ in outcome.errors]
    for line in outcome.done:
        echo(f"done: {line}", False)
    for message, _code in outcome.errors:
        echo(f"pveclean: {message}", True)
    return outcome.exit_code

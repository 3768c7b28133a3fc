"""Golden documents: what pveclean writes for a fixed set of lab runs, kept in tests/golden/
and compared line by line, so that a refactor that must not change behaviour (issue 36)
shows every report, `--json` output, text output, metrics file and exit code it changed.

One lab, laid out once, serves every document, made in this order (DOCUMENTS): the seeds'
situation in CT 990101 (its other container 990102, a host daemon) seen by `gpus`, `status`
and `metrics` (with dcgm-exporter's job files), then a dry run and a real `ct` of it; the
seeds again in CT 990103, stopped and started through the hookscript (pre-stop, post-stop
with a leak, pre-start of a leftover, post-start); a VM start refused by the VM guard;
`ct` of the other container; `gpus` and `metrics` once more; `reports`; the node_exporter
textfile and the syslog lines those runs wrote; every command's exit code.

`PVECLEAN_GOLDEN=record` rewrites tests/golden/ from this run; otherwise each document is
compared with its recording and a difference fails with a unified diff naming it.
`PVECLEAN_GOLDEN_RAW=DIR` also writes the documents as pveclean wrote them to DIR (to see
what the normalising did). Only what legitimately varies between two runs is normalised (see
`Normalizer`); VMIDs are fixed so that they, and what is named after them, stay in the
documents as written. The lab's lock (tests/lab: one lab run at a time) keeps other labs'
processes out of the host's views.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pveclean.proxmox.hookscript import stamp
from tests.harness import pvesh, qm
from tests.harness.lxclab import REPO, Lab, LabUnavailable, cgroup2_root, lab_unavailable_reason
from tests.harness.scenarios import seeds
from tests.helpers import hook, pveclean, reports, wait_for

pytestmark = pytest.mark.lab  # a skip of it fails under CI=true (tests/conftest.py)

GOLDEN = REPO / "tests" / "golden"
RECORD = os.environ.get("PVECLEAN_GOLDEN") == "record"
RAW = os.environ.get("PVECLEAN_GOLDEN_RAW")  # a directory: the documents before normalising

# Fixed VMIDs (the `vmid` fixture's vary with the test process): they are in the documents.
CT, OTHER_CT, HOOK_CT, VM = 990101, 990102, 990103, 990110
GRACE_S = 3
TERM_DELAY_MS = 1500  # each holder outlives SIGTERM this long (well within the grace): the
# probe, which lists them in the container while they stop, always sees them
LEAK_MIB = 2048  # GPU 1 memory no process accounts for, for post-stop's leak check

# The documents (tests/golden/NAME), in the order they are made.
DOCUMENTS = [
    "seeds-gpus.json", "seeds-gpus.txt", "seeds-status.json", "seeds-status.txt",
    "seeds-metrics.out", "seeds-metrics-gpus.prom", "seeds-dcgm-jobs.txt",
    "ct-dry-run.txt", "ct-dry-run.json", "ct.json", "ct-report.yaml",
    "hook-pre-stop.out", "hook-pre-stop-report.yaml", "hook-post-stop-report.yaml",
    "hook-post-stop.log", "hook-start.out", "hook-pre-start-report.yaml",
    "hook-post-start.out",
    "vm-pre-start.out", "vm-pre-start-report.yaml",
    "ct-other.txt", "ct-other-report.yaml", "end-gpus.json", "end-metrics-gpus.prom",
    "reports.txt", "reports.json", "reports-show-ct.txt",
    "metrics.prom", "syslog.txt", "exit-codes.txt",
]


class Normalizer:
    """Replaces, in a document's text, what varies between two runs of the same steps, and
    nothing else:

    - PIDs (host, container, parent, init, the syslog tag's) by `<pidN>`, numbered in the
      order of their first appearance in the document, so that equal PIDs stay equal; a
      PID is known by its key (`host_pid: 12`, `"ct_pid": 12`), its words ("PID 12",
      "pid=12", `pveclean[12]`; the padding after it made one space) or its table column
      (HOST PID, CT PID), never by its value alone (a MiB figure equal to a PID stays);
    - kernel start times (`starttime: 123`) by `<starttime>`;
    - two counts that vary with timing and the host, by `<n>`: how often the freezer froze a
      tree ("frozen 5 time(s)": once per look of the stop loop, so it follows how fast the
      holders exit) and the host's process count (`host_processes` of `gpus`' scan);
    - seconds measured by the run: a table's SECONDS column, a number before "s" with a
      fraction ("2.31 s", "+0.01s"), a `..._s` key's value, a `..._seconds` metric's value
      by `<s>`, milliseconds ("in 71 ms") by `<ms>` (configured whole seconds, "grace 3 s",
      `grace_seconds: 3`, stay);
    - the lab's root (a fresh temporary directory) by `<lab>`, its name by `<labname>`, the
      checkout (where the holder programs are built) by `<repo>`, the cgroup2 mount (the
      host's: /sys/fs/cgroup or /sys/fs/cgroup/unified) by `<cgroup2>`;
      the fake GPU nodes' device numbers (the first free ones on the host) by `<dev:NAME>`;
    - timestamps (ISO 8601, and the compact form of report file names) by `<time>`,
      Proxmox task ids (hex PID and time) by `<upid>`;
    - this machine's host name where pveclean names the node (`host:`, `node="..."`,
      `node/...`, "GPUs of ... at", "on ..., pveclean") by `<hostname>`.
    Tables are read before anything changes a line's width (their columns are found by
    position under the header); a replaced cell keeps two spaces after it, as the width of
    its column follows the widest PID."""

    PID_COLUMNS = ("PID", "HOST PID", "CT PID")
    SECONDS_COLUMNS = ("SECONDS",)
    KEYED_PID = re.compile(r"""((?:^|[\s{,])["']?(?:host_pid|ct_pid|ppid|init_pid|pid)["']?:"""
                           r"""\s*)(\d+)""")
    WORDED_PID = re.compile(r"(\b(?:PIDs?|pid)[ :=]|\bpveclean\[)(\d+(?:, \d+)*)( {2,}(?=\S))?")
    STARTTIME = re.compile(r"""(["']?starttime["']?:\s*)\d+""")
    TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
                      r"|\d{8}T\d{6}(?:\.\d+)?Z")
    UPID = re.compile(r"UPID:[0-9A-Za-z-]+:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:[^\s'\"]*")
    FRACTION_S = re.compile(r"\b\d+\.\d+(?= ?s\b)")
    MILLISECONDS = re.compile(r"\b\d+(?= ms\b)")
    KEYED_S = re.compile(r"""(\b(?:\w+_s|seconds)["']?(?::\s*|=))\d+(?:\.\d+)?""")
    TIMING_COUNTS = re.compile(r"""(\bfrozen |["']?host_processes["']?:\s*)\d+""")
    METRIC_S = re.compile(r"^(pveclean\w*_seconds(?:\{[^}]*\})? )\S+$", re.M)
    HOST_WORDS = (r"""(\bhost["']?:\s*["']?)""", r'(\bnode=")', r'(\bid="node/)',
                  r"(\bGPUs of )", r"(\bstarted <time> on )")

    def __init__(self, lab: Lab) -> None:
        self.literal = [(str(lab.root), "<lab>"), (lab.root.name, "<labname>"),
                        (str(REPO), "<repo>"), (str(cgroup2_root()), "<cgroup2>")]
        self.devices = {f"{os.major(p.stat().st_rdev)}:{os.minor(p.stat().st_rdev)}":
                        f"<dev:{name}>" for name, p in lab.nodes.items()}
        host = re.escape(os.uname().nodename)
        self.host = [re.compile(words + host + r"\b") for words in self.HOST_WORDS]

    def __call__(self, text: str) -> str:
        text = self._numbers(text)
        for value, placeholder in self.literal:
            text = text.replace(value, placeholder)
        for number, placeholder in self.devices.items():
            text = re.sub(rf"(?<![\d:]){number}(?![\d:])", placeholder, text)
        text = self.UPID.sub("<upid>", text)
        text = self.TIME.sub("<time>", text)
        text = self.METRIC_S.sub(r"\1<s>", text)
        text = self.KEYED_S.sub(r"\1<s>", text)
        text = self.FRACTION_S.sub("<s>", text)
        text = self.MILLISECONDS.sub("<ms>", text)
        text = self.STARTTIME.sub(r"\1<starttime>", text)
        text = self.TIMING_COUNTS.sub(r"\1<n>", text)
        for pattern in self.host:
            text = pattern.sub(r"\1<hostname>", text)
        return text

    def _numbers(self, text: str) -> str:
        """PIDs (numbered in the order they appear) and the tables' SECONDS column."""
        names: dict[str, str] = {}

        def name(pid: str) -> str:
            return names.setdefault(pid, f"<pid{len(names) + 1}>")

        def pid(m: re.Match[str]) -> str:
            return name(m.group())

        def numbered(m: re.Match[str]) -> str:  # padding after "PID 123" is one space
            pad = " " if m.lastindex == 3 and m.group(3) else ""
            return m.group(1) + re.sub(r"\d+", pid, m.group(2)) + pad

        out = []
        columns: dict[tuple[int, int], str] = {}  # (start, end) of a column -> its placeholder
        for line in text.splitlines(keepends=True):
            titles = {(c.start(), c.end()): c.group() for c in re.finditer(r"\S+(?: \S+)*", line)}
            if not re.search(r"\d", line) and set(titles.values()) & {
                    *self.PID_COLUMNS, *self.SECONDS_COLUMNS}:
                columns = {span: "<s>" if title in self.SECONDS_COLUMNS else "pid"
                           for span, title in titles.items()
                           if title in self.PID_COLUMNS + self.SECONDS_COLUMNS}
                out.append(line)
                continue
            if not line.strip():
                columns = {}
            line = self._cells(line, columns, name)
            line = self.KEYED_PID.sub(numbered, line)
            out.append(self.WORDED_PID.sub(numbered, line))
        return "".join(out)

    @staticmethod
    def _cells(line: str, columns: dict[tuple[int, int], str],
               names: Callable[[str], str]) -> str:
        """A table row's numbers in a PID or SECONDS column: the one word under the column's
        title, a number that starts under its start (left-aligned) or ends under its end
        (right-aligned). A line with no such number in the table's first PID or SECONDS
        column is no row (a note under the table, a row's continuation)."""
        words = [(w, w.start() + len(w.group().rstrip())) for w in re.finditer(r"\S+ *", line)]
        cells = []
        for (start, end), kind in sorted(columns.items()):
            under = [(w, w_end) for w, w_end in words if w.start() < end and w_end > start]
            if len(under) != 1 or not re.fullmatch(r"\d[\d.]* *", under[0][0].group()):
                continue
            m, m_end = under[0]
            if m.start() == start or m_end == end:
                cells.append(((start, end), m, kind))
        if not cells or cells[0][0] != min(columns):
            return line
        replaced = []  # named left to right, replaced right to left
        for _span, m, kind in cells:
            pad = "  " if m.end() < len(line.rstrip()) else ""
            replaced.append((m, (names(m.group().rstrip()) if kind == "pid" else kind) + pad))
        for m, text in reversed(replaced):
            line = line[:m.start()] + text + line[m.end():]
        return line


# ---- the lab runs ----------------------------------------------------------------------
def _out(r: subprocess.CompletedProcess[str]) -> str:
    """A command's whole answer: exit status, stdout, stderr."""
    return f"exit: {r.returncode}\n--- stdout\n{r.stdout}--- stderr\n{r.stderr}"


class Runs:
    """The documents of one lab, made in DOCUMENTS' order; exit codes of JSON outputs (whose
    stdout is a document as written) are kept in exit-codes.txt."""

    def __init__(self, lab: Lab, syslog: socket.socket) -> None:
        self.lab = lab
        self.syslog = syslog
        self.docs: dict[str, str] = {}
        self.codes: list[str] = []
        self.lines: list[str] = []

    def run(self, *args: str, doc: str | None = None) -> subprocess.CompletedProcess[str]:
        r = pveclean(self.lab, *args)
        self.codes.append(f"pveclean {' '.join(args)}: {r.returncode}")
        if doc is not None:
            self.docs[doc] = r.stdout if doc.endswith(".json") else _out(r)
        self.drain()
        return r

    def report(self, doc: str, vmid: int, phase: str) -> None:
        """The report file the run of `phase` wrote, as written."""
        paths = sorted(self.lab.report_dir.glob(f"{vmid}-{phase}-*.yaml"))
        assert len(paths) == 1, f"{doc}: {len(paths)} report files of {vmid} {phase}"
        self.docs[doc] = paths[0].read_text()

    def drain(self) -> None:
        """The syslog lines sent so far (read as they come: a datagram socket's queue is
        short, and a full one would make a run record a failed log line)."""
        while True:
            try:
                self.lines.append(self.syslog.recv(65536).decode())
            except BlockingIOError:
                return


def _pids_will_not_wrap(need: int = 8000) -> None:
    """Holders and other GPU users are listed in PID order: should the host's PIDs wrap around
    (pid_max is 32768 on many hosts) between two processes' starts, their order would change.
    With fewer than `need` PIDs left before pid_max (a run takes 1000 to 2500 on a busy
    host), they are used up first, by short-lived children, so that all of the run's PIDs
    rise from the bottom of the range."""
    def last() -> int:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())

    start = last()
    if int(Path("/proc/sys/kernel/pid_max").read_text()) - start > need:
        return
    while last() >= start:
        subprocess.run(["/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do (:); i=$((i+1)); done"],
                       check=True)


def _seeds_documents(runs: Runs, lab: Lab) -> None:
    seeds(lab, CT, other_vmid=OTHER_CT, host=True, term_delay_ms=TERM_DELAY_MS)
    lab.install_hook(CT)
    runs.run("gpus", "--json", doc="seeds-gpus.json")
    runs.run("gpus", doc="seeds-gpus.txt")
    runs.run("status", "--json", doc="seeds-status.json")
    runs.run("status", doc="seeds-status.txt")
    textfiles = lab.root / "node-exporter"
    jobs = lab.root / "dcgm-jobs"
    runs.run("metrics", "--textfile-dir", str(textfiles), "--dcgm-job-dir", str(jobs),
             doc="seeds-metrics.out")
    runs.docs["seeds-metrics-gpus.prom"] = (textfiles / "pveclean_gpus.prom").read_text()
    runs.docs["seeds-dcgm-jobs.txt"] = "".join(f"== {p.name}\n{p.read_text()}"
                                               for p in sorted(jobs.iterdir()))
    runs.run("ct", str(CT), "--dry-run", doc="ct-dry-run.txt")
    runs.run("ct", str(CT), "--dry-run", "--json", doc="ct-dry-run.json")
    runs.run("ct", str(CT), "--json", doc="ct.json")
    runs.report("ct-report.yaml", CT, "manual")


def _hook_documents(runs: Runs, lab: Lab) -> None:
    """Pre-stop and post-stop as `pct stop` runs them, a leftover's pre-start and the
    post-start as `pct start` runs them, post-start once more alone."""
    assert lab.nvml is not None
    seeds(lab, HOOK_CT, host=False, term_delay_ms=TERM_DELAY_MS)
    lab.install_hook(HOOK_CT)
    lab.nvml.leak(1, LEAK_MIB)  # the driver keeps memory no process accounts for
    res = lab.pct("stop", str(HOOK_CT))
    runs.docs["hook-pre-stop.out"] = _out(res)
    runs.report("hook-pre-stop-report.yaml", HOOK_CT, "pre-stop")
    assert wait_for(lambda: reports(lab, HOOK_CT, "post-stop"), 30)
    runs.report("hook-post-stop-report.yaml", HOOK_CT, "post-stop")
    runs.docs["hook-post-stop.log"] = (lab.root / "log" / f"poststop-{HOOK_CT}.log").read_text()
    lab.nvml.leak(1, 0)
    # a leftover of that run in the container's cgroup tree (as test_hook's leftover_after_stop)
    monitor = lab.cgroup(HOOK_CT).parent.parent / "lxc.monitor" / str(HOOK_CT) / "cgroup.procs"
    wait_for(lambda: not monitor.exists() or not monitor.read_text().strip(), 5)
    lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                    cgroup=lab.cgroup(HOOK_CT) / "ns", gpu_mib={0: 700})
    runs.docs["hook-start.out"] = _out(lab.pct("start", str(HOOK_CT)))
    runs.report("hook-pre-start-report.yaml", HOOK_CT, "pre-start")
    runs.docs["hook-post-start.out"] = _out(hook(lab, HOOK_CT, "post-start"))
    runs.drain()


def _vm_documents(runs: Runs, lab: Lab) -> None:
    """A VM passing GPU 0 through (held by CT 990102's worker and the host's daemon): its
    pre-start is refused (vm_gpu_policy: refuse, the default)."""
    exe = Path(sys.executable).parent / "pveclean"
    script = lab.snippets / "pveclean-vm-hook"
    script.write_text(stamp((REPO / "hookscripts/pveclean-hook").read_text(), str(exe),
                            str(lab.config_path)))
    script.chmod(0o755)
    qm.create_vm(lab.root, VM, (0,), "local:snippets/pveclean-vm-hook")
    runs.run("vmhook", str(VM), "pre-start", doc="vm-pre-start.out")
    runs.report("vm-pre-start-report.yaml", VM, "pre-start")


def _last_documents(runs: Runs, lab: Lab) -> None:
    """CT 990102's worker exits at once on SIGTERM, before any probe could list it (late or
    not, a matter of timing): this run is made without the probe."""
    _configure(lab, probe=False)
    runs.run("ct", str(OTHER_CT), doc="ct-other.txt")
    runs.report("ct-other-report.yaml", OTHER_CT, "manual")
    runs.run("gpus", "--json", doc="end-gpus.json")  # the VM passes GPU 0 now
    textfiles = lab.root / "node-exporter"
    runs.run("metrics", "--textfile-dir", str(textfiles))
    runs.docs["end-metrics-gpus.prom"] = (textfiles / "pveclean_gpus.prom").read_text()
    runs.run("reports", doc="reports.txt")
    runs.run("reports", "--json", doc="reports.json")
    (name,) = [p.name for p in lab.report_dir.glob(f"{CT}-manual-*.yaml")]
    runs.run("reports", "show", name, doc="reports-show-ct.txt")
    runs.docs["metrics.prom"] = (lab.root / "textfile" / "pveclean.prom").read_text()
    runs.docs["syslog.txt"] = "".join(line.rstrip("\n") + "\n" for line in runs.lines)
    runs.docs["exit-codes.txt"] = "".join(line + "\n" for line in runs.codes)


def _configure(lab: Lab, **more: object) -> None:
    """The lab's config: its VMs' paths, metrics and syslog lines written by every run."""
    lab.write_config(grace_seconds=GRACE_S, state_dir=str(lab.root / "state"),
                     metrics_path=str(lab.root / "textfile" / "pveclean.prom"),
                     syslog=True, syslog_socket=str(lab.root / "log.sock"),
                     journal_socket=str(lab.root / "no-journal"),
                     pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"), **more)


def _make_lab(root: Path) -> Lab:
    """The lab as a Proxmox host with VMs (conftest's `host` and `vm_host` set-up), its runs
    writing metrics and syslog lines."""
    lab = Lab.create(root)
    pvesh.install(lab.root)
    qm.lay_out_pci(lab.root, 4)
    return lab


@pytest.fixture(scope="module")
def documents() -> Iterator[dict[str, str]]:
    """Every document of the lab runs, normalised."""
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab: {reason}")
    root = Path(tempfile.mkdtemp(prefix="pveclean-lab-", dir="/tmp"))
    try:
        lab = _make_lab(root)
    except LabUnavailable as exc:
        pytest.skip(f"lab: {exc}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(lab.root / "log.sock"))
        sock.setblocking(False)
        _configure(lab)
        runs = Runs(lab, sock)
        _pids_will_not_wrap()
        _seeds_documents(runs, lab)
        _hook_documents(runs, lab)
        _vm_documents(runs, lab)
        _last_documents(runs, lab)
        if RAW:
            Path(RAW).mkdir(parents=True, exist_ok=True)
            for name, text in runs.docs.items():
                (Path(RAW) / name).write_text(text)
        normalize = Normalizer(lab)
        yield {name: normalize(text) for name, text in runs.docs.items()}
    except LabUnavailable as exc:
        pytest.skip(f"lab: {exc}")
    finally:
        sock.close()
        qm.stop_all(lab.root)
        lab.destroy()


def test_the_documents_are_the_recorded_ones(documents: dict[str, str]) -> None:
    assert list(documents) == DOCUMENTS
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        for stale in set(p.name for p in GOLDEN.iterdir()) - set(DOCUMENTS):
            (GOLDEN / stale).unlink()
        for name, text in documents.items():
            (GOLDEN / name).write_text(text)
        return
    diffs = []
    for name, text in documents.items():
        path = GOLDEN / name
        recorded = path.read_text() if path.exists() else ""
        if text != recorded:
            diffs.append("".join(difflib.unified_diff(
                recorded.splitlines(keepends=True), text.splitlines(keepends=True),
                f"tests/golden/{name} (recorded)", f"{name} (this run)")))
    extra = sorted({p.name for p in GOLDEN.iterdir()} - set(DOCUMENTS))
    if extra:
        diffs.append(f"tests/golden/ holds documents no run makes: {', '.join(extra)}")
    if diffs:
        pytest.fail("documents differ from tests/golden/ (PVECLEAN_GOLDEN=record rewrites them "
                    "once a change is meant):\n" + "\n".join(diffs), pytrace=False)


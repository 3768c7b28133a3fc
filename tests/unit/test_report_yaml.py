"""Reports through PyYAML: whatever a report holds, and whatever a container puts in its
strings, both of PyYAML's loaders read back what either of its dumpers wrote; for a terminal the
text is printable ASCII only. And the config reader names the key and the line of what is
wrong."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pveclean.core import config
from pveclean.errors import ConfigError
from pveclean.host import reportfiles

LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])

# the strings that YAML's syntax and YAML 1.1's implicit types make tricky
TRICKY = ["", " ", "yes", "No", "ON", "off", "null", "Null", "~", "y", "n", "1", "010", "0x1F",
          "1_000", "1e3", "1.5", ".inf", "-.inf", ".nan", ".NaN", "12:30:00", "190:20:30",
          "2026-12-03", "2026-12-03T06:53:12Z", "<<", "=", "-", "- x", "--- ", "...", "? x",
          "a: b", "a:b", "a:", "a #b", "#c", "&a", "*a", "!tag", "|", ">", "%YAML", "@x",
          "`x", "'q'", '"d"', "[1]", "{a: 1}", "a,b", "x\n", "\nx", "x\n\n", "a\nb\n",
          "  lead", "trail  ", "a\tb", "\t", "\r\n", "a\rb", "\x85", "\u2028", "\u2029",
          "\ufeff", "\x00", "\x1b[31mred\x1b[0m", "\u202eevil", "\u2066x\u2069", "\udc80",
          "\U0001f600", "\xe9", "\xa0", "/dev/nvidia0", "python3 -m vllm --token=abc",
          "a\n  b\n c", "x" * 1100, "line\n\n\nend\n\n", "\n", "\n\n", "a\n b", " a\nb", "a \nb",
          "0.5 MiB", "state D (disk sleep)"]

texts = st.one_of(st.sampled_from(TRICKY), st.text(), st.text(alphabet="ab :#-\n'\" \t|>"))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts)
keys = st.one_of(texts, st.integers(), st.booleans(), st.none())
documents = st.dictionaries(keys, st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25,
), max_size=6)


@pytest.fixture(params=["libyaml", "pure-python"])
def dumper(request: pytest.FixtureRequest) -> Iterator[str]:
    """to_yaml with libyaml's dumper, and with PyYAML's own where libyaml is missing."""
    saved = getattr(yaml, "CSafeDumper", None)
    if request.param == "libyaml" and saved is None:
        pytest.skip("PyYAML built without libyaml")
    if request.param == "pure-python" and saved is not None:
        del yaml.CSafeDumper
    reportfiles._dumper.cache_clear()
    try:
        yield request.param
    finally:
        if saved is not None:
            yaml.CSafeDumper = saved
        reportfiles._dumper.cache_clear()


def same(a: Any, b: Any) -> bool:
    """Equality with NaN equal to itself and no bool/int confusion."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb) and same(a[ka], b[kb])
                                        for ka, kb in zip(a, b, strict=True))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def no_surrogates(v: Any) -> Any:
    """What a report says of a lone surrogate (os.fsdecode's stand-in for a byte that is not
    UTF-8): U+FFFD in its place."""
    if isinstance(v, str):
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in v)
    if isinstance(v, dict):
        return {no_surrogates(k): no_surrogates(x) for k, x in v.items()}
    if isinstance(v, list):
        return [no_surrogates(x) for x in v]
    return v


def round_trip(data: dict[Any, Any], terminal: bool) -> str:
    text = reportfiles.to_yaml(data, terminal=terminal)
    for loader in LOADERS:
        back = yaml.load(text, Loader=loader)
        assert same(back, no_surrogates(data)), (loader.__name__, text)
    if terminal:
        assert all(" " <= c <= "~" or c == "\n" for c in text), text
    return text


@pytest.mark.parametrize("terminal", [False, True])
@given(data=documents)
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_pyyaml_reads_back_any_report(dumper: str, data: dict[Any, Any], terminal: bool) -> None:
    round_trip(data, terminal)


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("s", TRICKY)
def test_tricky_strings_as_values_keys_and_items(dumper: str, s: str, terminal: bool) -> None:
    round_trip({"k": s, s: 1, "l": [s, {"a": s, "b": [s]}]}, terminal)


def test_a_hostile_report_round_trips(dumper: str) -> None:
    """Control characters, bidi overrides, huge values, GPU indices as int keys."""
    holder = {"host_pid": 4242, "name": "python3\x1b[2J\u202e", "state": "D\x07",
              "cmdline": "a --token=x\nb \u2066evil\u2069 " + "A" * 300_000,
              "gpu_memory_mib": {0: 100, 1: None, 7: 2 ** 40}}
    rep = {"vmid": 129, "verdict": "clean", "holders": [holder] * 3,
           "summary": {"freed_mib": 0.5, "hint": None, "ok": True, "big": 1e20}}
    text = round_trip(rep, terminal=False)
    assert "\x1b" not in text and "\x07" not in text  # escaped even in a file
    term = round_trip(rep, terminal=True)
    assert "\u202e" not in term and "\\u202E" in term and "\\e[2J" in term


def test_the_layout_is_block_style_in_the_report_s_order(dumper: str) -> None:
    rep = {"vmid": 129, "verdict": "clean", "when": "2026-12-03T06:53:12.253+00:00",
           "holders": [{"pid": 4242, "comm": "python3", "gpus": [0, 1], "exe": "/usr/bin/x"}],
           "errors": [], "summary": {"seconds": 0.25, "hint": None, "ok": True, "big": 1e20},
           "note": "one\ntwo\n", "tail": "a\nb", "units": {}, "nested": [[1, 2], {"x": []}],
           "long": "word " * 100 + "end"}
    assert reportfiles.to_yaml(rep) == (
        "vmid: 129\nverdict: clean\nwhen: '2026-12-03T06:53:12.253+00:00'\nholders:\n"
        "- pid: 4242\n  comm: python3\n  gpus:\n  - 0\n  - 1\n  exe: /usr/bin/x\nerrors: []\n"
        "summary:\n  seconds: 0.25\n  hint: null\n  ok: true\n  big: 1.0e+20\n"
        "note: |\n  one\n  two\ntail: |-\n  a\n  b\nunits: {}\nnested:\n- - 1\n  - 2\n"
        "- x: []\n" + f"long: {'word ' * 100}end\n")


@given(st.floats())
def test_floats_stay_floats(f: float) -> None:
    text = reportfiles.to_yaml({"f": f})
    assert same(yaml.safe_load(text)["f"], f), text


def test_what_is_not_plain_data_is_refused() -> None:
    with pytest.raises(yaml.YAMLError):
        reportfiles.to_yaml({"x": object()})


def test_a_written_report_reads_back_as_pveclean_reports_reads_it(tmp_path: Path) -> None:
    rep = {"pveclean": 1, "vmid": 129, "phase": "manual",
           "holders": [{"name": "\u202eevil\udc80", "gpu_memory_mib": {0: 1}}]}
    path = reportfiles.write(rep, str(tmp_path), reportfiles.report_name(129, "manual",
                                                                        1764669456.0))
    assert reportfiles.load(path) == {"pveclean": 1, "vmid": 129, "phase": "manual",
                                      "holders": [{"name": "\u202eevil\ufffd",
                                                   "gpu_memory_mib": {0: 1}}]}


def test_a_file_that_is_not_a_report_is_said_so(tmp_path: Path) -> None:
    bad = tmp_path / "129-manual-x.yaml"
    bad.write_text("a: [\n")
    with pytest.raises(reportfiles.ReportError, match="not valid YAML at line 2"):
        reportfiles.load(bad)
    bad.write_text("- 1\n")
    with pytest.raises(reportfiles.ReportError, match="not a pveclean report"):
        reportfiles.load(bad)


# ---- the config ---------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    ("probe: true\ngrace_seconds: x\n", "cfg line 2: 'grace_seconds' must be a number"),
    ("probe: true\n\nprobes: false\n", "cfg line 3: unknown key 'probes' (did you mean 'probe'?)"),
    ("probe: true\nprobe: false\n", "cfg line 2: key 'probe' given twice"),
    ("keep_reports: 0x10\nkeep_reports: 1\n", "cfg line 2: key 'keep_reports' given twice"),
    ("devices: [/dev/nvidia0\n", "cfg line 2: "),
    ("report_dir: a\n  b: c\n", "cfg line 2: mapping values are not allowed"),
    ("- a\n- b\n", "cfg line 1: top level must be a mapping"),
    ("[a]: 1\n", "cfg line 1: unknown key None"),
    ("7: 1\n", "cfg line 1: unknown key '7'"),
    ("probe: \x1b\n", "cfg: invalid YAML"),  # no line: the reader refuses the character
    ("redact:\n  - '('\n", "cfg: 'redact' pattern '(' is not a valid regex"),
    ("probe: *x\n", "cfg line 1: "),
])
def test_config_errors_name_the_key_and_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config.parse(text, "cfg")
    assert str(exc.value).startswith(message), exc.value
    assert "\n" not in str(exc.value)


def test_the_config_reads_what_yaml_1_1_says() -> None:
    cfg = config.parse("probe: no\ngrace_seconds: 2\nkeep_reports: 7\ndevices:\n- /dev/x\n"
                       "phases:\n  pre-start: off\n# a comment\nmetrics_path: ~\n", "cfg")
    assert (cfg.probe, cfg.grace_seconds, cfg.keep_reports, cfg.devices) == (False, 2.0, 7,
                                                                              ["/dev/x"])
    assert cfg.phases["pre-start"] is False and cfg.phases["pre-stop"] is True
    assert cfg.metrics_path is None and isinstance(cfg.grace_seconds, float)


def test_the_shipped_config_spells_out_the_defaults_and_dumps_back() -> None:
    text = (Path(__file__).parents[2] / "config" / "pveclean.yaml").read_text()
    cfg = config.parse(text)
    assert cfg == config.Config(source="<string>")
    dumped = config.dump(cfg)
    assert dumped.startswith("# effective configuration (from <string>)\n")
    assert config.parse(dumped) == cfg

"""pveclean's own YAML writer (minyaml) against PyYAML: whatever a report holds, and whatever a
container puts in its strings, PyYAML reads back the same data."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pveclean.core import minyaml

LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])

# the strings that YAML's syntax and YAML 1.1's implicit types make tricky
TRICKY = ["", " ", "yes", "No", "ON", "off", "null", "Null", "~", "y", "n", "1", "010", "0x1F",
          "1_000", "1e3", "1.5", ".inf", "-.inf", ".nan", ".NaN", "12:30:00", "190:20:30",
          "2026-12-03", "2026-12-03T06:53:12Z", "<<", "=", "-", "- x", "--- ", "...", "? x",
          "a: b", "a:b", "a:", "a #b", "#c", "&a", "*a", "!tag", "|", ">", "%YAML", "@x",
          "`x", "'q'", '"d"', "[1]", "{a: 1}", "a,b", "x\n", "\nx", "x\n\n", "a\nb\n",
          "  lead", "trail  ", "a\tb", "\t", "\r\n", "a\rb", "\x85", "\u2028", "\u2029",
          "\ufeff", "\x00", "\x1b[31mred\x1b[0m", "\u202eevil", "\udc80", "😀", "é", "\xa0",
          "/dev/nvidia0", "python3 -m vllm --token=abc", "a\n  b\n c", "x" * 1100,
          "line\n\n\nend\n\n", "\n", "\n\n", "a\n b", " a\nb", "a \nb"]

texts = st.one_of(st.sampled_from(TRICKY), st.text(), st.text(alphabet="ab :#-\n'\" \t|>"))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts)
keys = st.one_of(texts, st.integers(), st.booleans(), st.none())
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25,
)


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
    """What minyaml writes for a string with a lone surrogate: U+FFFD in its place."""
    if isinstance(v, str):
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in v)
    if isinstance(v, dict):
        return {no_surrogates(k): no_surrogates(x) for k, x in v.items()}
    if isinstance(v, list):
        return [no_surrogates(x) for x in v]
    return v


def round_trip(data: Any, terminal: bool) -> None:
    text = minyaml.dump(data, terminal=terminal)
    for loader in LOADERS:
        back = yaml.load(text, Loader=loader)
        assert same(back, no_surrogates(data)), (loader.__name__, text)
    if terminal:
        assert text.isascii() and all(" " <= c <= "~" or c in "\n" for c in text), text


@pytest.mark.parametrize("terminal", [False, True])
@given(data=documents)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_pyyaml_reads_back_what_minyaml_writes(data: Any, terminal: bool) -> None:
    round_trip(data, terminal)


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("s", TRICKY)
def test_tricky_strings_as_values_keys_and_items(s: str, terminal: bool) -> None:
    round_trip({"k": s, s: 1, "l": [s, {"a": s, "b": [s]}]}, terminal)


@given(st.floats())
def test_floats_stay_floats(f: float) -> None:
    text = minyaml.dump({"f": f})
    assert same(yaml.safe_load(text)["f"], f), text


def test_layout_is_pyyaml_block_style() -> None:
    """The text PyYAML wrote for reports before (block style, `|` for multi-line text)."""

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, lambda d, s: d.represent_scalar(
        "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))
    rep = {"vmid": 129, "verdict": "clean", "when": "2026-12-03T06:53:12.253+00:00",
           "holders": [{"pid": 4242, "comm": "python3", "gpus": [0, 1], "exe": "/usr/bin/x"}],
           "errors": [], "summary": {"seconds": 0.25, "hint": None, "ok": True, "big": 1e20},
           "note": "one\ntwo\n", "tail": "a\nb", "units": {}, "nested": [[1, 2], {"x": []}]}
    expected = yaml.dump(rep, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True, width=100)
    assert minyaml.dump(rep) == expected


def test_bidi_and_escape_sequences_never_reach_a_terminal_raw() -> None:
    text = minyaml.dump({"comm": "\u202eevil\x1b]0;owned\x07", "é": "ok"}, terminal=True)
    assert "\u202e" not in text and "\x1b" not in text and "é" not in text
    assert yaml.safe_load(text) == {"comm": "\u202eevil\x1b]0;owned\x07", "é": "ok"}


def test_what_is_not_plain_data_is_refused() -> None:
    with pytest.raises(TypeError):
        minyaml.dump({"x": object()})


# ---- the config reader ----------------------------------------------------------------------
CONFIG_SCALARS = [
    "true", "yes", "No", "off", "~", "null", "NULL", "10", "010", "0", "-0", "+7", "0x10", "0o7",
    "1_000", "1.5", "1.", ".5", "-1.25", "1e3", "1.0e+3", ".inf", "-.inf", ".nan", "12:30",
    "2026-12-03", "/dev/nvidia*", "/var/log/pveclean", "root@pam", "pre-stop", "a b",
    r"(?<![\w-])(?=--[\w-]*?(?:token|password))(--[\w-]*+[= ])\S++",
    r"\b(?=\w*?(?:KEY))(\w*+=)\S++",
    r"(://[^/\s:@]++:)[^@\s/]++(?P<tail>@)", "'q'", "'it''s'", "''", "'a #b'", "\"d\"", '""',
    '"a\\nb"', '"a #b"', "a #c", "a#c", "'a'#c", "'a' #c", "'a' b", "'open", '"open', "[1, 2]",
    "{a: 1}", "&x a", "*x", "!!str 1", "!!int 7", "- a", "-a", "a: b", "a:", "a:b", "|", ">",
    "%x", "@x", "`x", "=", "<<", "? x", ", x", "#", "é", "a\tb", "\x1b", "x  ", "it's", 'say "hi"',
]
CONFIG_KEYS = ["devices", "probe", "api", "phases", "grace_seconds", "x", "yes", "null", "a-b",
               "_k", "K9", "9k", "pre-start", "host"]


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    key = st.sampled_from(CONFIG_KEYS)
    scalar = st.sampled_from(CONFIG_SCALARS)
    indent = st.sampled_from(["", " ", "  ", "    "])
    line = st.one_of(
        st.builds(lambda k, sep, v: f"{k}{sep}{v}", key, st.sampled_from([": ", ":  ", ":", " :"]),
                  scalar),
        st.builds(lambda k, tail: f"{k}:{tail}", key, st.sampled_from(["", "  ", " # c", " #"])),
        st.builds(lambda i, v: f"{i}- {v}", indent, scalar),
        st.builds(lambda i, k, v: f"{i}{k}: {v}", indent, key, scalar),
        st.builds(lambda i, k: f"{i}{k}:", indent, key),
        st.sampled_from(["", "# a comment", "  # indented comment", "   ", "---", "...", "-",
                         "  continued", "\t- x", "key: a\r", "- x", "%YAML 1.1"]),
    )
    lines = draw(st.lists(line, max_size=12))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n\n"]))


@st.composite
def plain_configs(draw: st.DrawFn) -> str:
    """Configs shaped as the subset is (most of them read by minyaml), with tricky scalars."""
    readable = st.sampled_from([v for v in CONFIG_SCALARS if minyaml.config_entries(f"k: {v}")])
    scalar = st.one_of(readable, readable, readable, readable, st.sampled_from(CONFIG_SCALARS))
    comment = st.sampled_from(["", "", " # c", "  #c"])
    out = []
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=6)):
        kind = draw(st.sampled_from(["scalar", "list", "map", "empty"]))
        if kind == "scalar":
            out.append(f"{key}: {draw(scalar)}{draw(comment)}")
            continue
        out.append(f"{key}:{draw(comment)}")
        indent = draw(st.sampled_from(["", "  ", "    "] if kind == "list" else ["  ", "    "]))
        for _ in range(draw(st.integers(0 if kind == "empty" else 1, 3)) if kind != "empty"
                       else 0):
            if draw(st.integers(0, 5)) == 0:
                out.append(draw(st.sampled_from(["", "# between", "  # between"])))
            if kind == "list":
                out.append(f"{indent}- {draw(scalar)}{draw(comment)}")
            else:
                out.append(f"{indent}{draw(st.sampled_from(CONFIG_KEYS))}: {draw(scalar)}"
                           f"{draw(comment)}")
    return "\n".join(out) + "\n"


def pyyaml_entries(text: str) -> Any:
    from pveclean import errors
    from pveclean.core import config

    try:
        entries = config._pyyaml_entries(text, "x")
    except errors.ConfigError as exc:
        return exc
    # parse() reads no value for a key it rejects: read them all, for the comparison
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    constructor = yaml.constructor.SafeConstructor()
    return [(k, line, constructor.construct_object(v, deep=True))
            for (k, line, _), (_, v) in zip(entries, node.value if node else [], strict=True)]


@given(text=st.one_of(config_texts(), plain_configs()))
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_config_reader_reads_what_pyyaml_reads_or_leaves_it_to_pyyaml(text: str) -> None:
    fast = minyaml.config_entries(text)
    if fast is not None:
        slow = pyyaml_entries(text)
        assert not isinstance(slow, Exception), (text, slow)
        assert same(fast, slow), (text, fast, slow)


def test_the_shipped_config_is_read_without_pyyaml() -> None:
    from pathlib import Path

    from pveclean.core import config

    text = (Path(__file__).parent.parent.parent / "config" / "pveclean.yaml").read_text()
    fast = minyaml.config_entries(text)
    assert fast is not None and fast == config._pyyaml_entries(text, "x")
    assert config.parse(text) == config.Config(source="<string>")  # it spells out the defaults


@pytest.mark.parametrize("text", [
    "devices: [/dev/nvidia0]\n", "probe: !!bool yes\n", "grace_seconds: 0x10\n",
    "report_dir: /var/log\n  /pveclean\n", "a: &x 1\nb: *x\n", "api:\n  host: a\n  host: b\n",
    "redact:\n  - \"\\\\d+\"\n", "report_dir: /var/log é\n", "probe: true\r\n",
    "---\nprobe: true\n",
])
def test_what_is_beyond_the_subset_goes_to_pyyaml(text: str) -> None:
    assert minyaml.config_entries(text) is None

"""host/fstext against text rendered as the kernel renders it (fs/proc_namespace.c
show_mountinfo, fs/proc/task_mmu.c show_map_vma, fs/proc/fd.c seq_show, io_uring/fdinfo.c),
over mount points, fs types, sources, mapped paths and registered files holding every byte a
path may hold (all but NUL): each parse gives back exactly what was rendered, and no byte but
a newline ends a line."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.host import fstext

ESCAPED = b" \t\n\\"  # mangle(): what mountinfo and io_uring's file list escape as \ooo


def mangle(raw: bytes, esc: bytes = ESCAPED) -> bytes:
    return b"".join(b"\\%03o" % c if c in esc else bytes((c,)) for c in raw)


def path_bytes(min_size: int = 0) -> st.SearchStrategy[bytes]:
    """Any bytes but NUL; \\f, \\r, \\v, \\x1c-\\x1e, \\x85 and UTF-8 U+2028 made likely."""
    tricky = st.sampled_from([b"\n", b"\f", b"\r", b"\v", b"\x1c", b"\x1d", b"\x1e", b"\x85",
                              "\u2028".encode(), b" ", b"\t", b"\\", b" - ", b"\\012", b"-"])
    return st.lists(st.one_of(tricky, st.binary(min_size=1, max_size=8)), max_size=12).map(
        lambda parts: b"".join(parts).replace(b"\0", b"")).filter(lambda b: len(b) >= min_size)


def abs_path() -> st.SearchStrategy[bytes]:
    return path_bytes().map(lambda b: b"/" + b)


u32 = st.integers(0, 2**31 - 1)
OPTIONAL = st.lists(st.sampled_from([b"shared:1", b"master:7", b"propagate_from:3",
                                     b"unbindable"]), max_size=3)


@st.composite
def mounts(draw: st.DrawFn) -> fstext.Mount:
    fstype = draw(st.one_of(st.sampled_from([b"ext4", b"tmpfs", b"9p", b"devtmpfs"]),
                            path_bytes(1).map(lambda b: b"fuse." + b)))
    return fstext.Mount(
        mount_id=draw(u32), parent_id=draw(u32), dev=(draw(st.integers(0, 4095)),
                                                      draw(st.integers(0, 2**20 - 1))),
        root=draw(abs_path()), mount_point=draw(abs_path()),
        options=draw(st.sampled_from([b"rw", b"ro,nosuid,nodev", b"rw,relatime"])),
        optional=tuple(draw(OPTIONAL)), fstype=fstype, source=draw(path_bytes(1)),
        super_options=draw(path_bytes().map(lambda b: b"rw" + b.replace(b"\n", b""))))


def render_mount(m: fstext.Mount) -> bytes:
    opt = b"".join(b" " + o for o in m.optional)
    return (b"%d %d %d:%d " % (m.mount_id, m.parent_id, *m.dev) + mangle(m.root) + b" "
            + mangle(m.mount_point) + b" " + m.options + opt + b" - " + mangle(m.fstype)
            + b" " + mangle(m.source) + b" " + m.super_options + b"\n")


def chunked(text: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(st.lists(mounts(), min_size=1, max_size=6), st.lists(st.integers(0, 10**6)))
def test_mountinfo_lines_parse_back_exactly(ms: list[fstext.Mount], cuts: list[int]) -> None:
    text = b"".join(render_mount(m) for m in ms)
    got = [fstext.parse_mount(line) for line in fstext.lines(chunked(text, cuts))]
    assert got == ms


@st.composite
def mappings(draw: st.DrawFn) -> tuple[fstext.Mapping, bytes]:
    start = draw(st.integers(0, 2**47)) & ~0xFFF
    end = start + (draw(st.integers(1, 2**20)) << 12)
    name = draw(st.one_of(st.just(b""), st.sampled_from([b"[heap]", b"[stack]", b"[vdso]"]),
                          path_bytes().map(lambda b: b"[anon:" + b.replace(b"\n", b"") + b"]"),
                          abs_path()))
    shown = name.replace(b"\n", b"\\012")  # seq_path(m, path, "\n"): only the newline
    m = fstext.Mapping(start, end, draw(st.sampled_from([b"r--p", b"rw-s", b"r-xp", b"---p"])),
                       draw(st.integers(0, 2**40)) & ~0xFFF,
                       (draw(st.integers(0, 4095)), draw(st.integers(0, 2**20 - 1))),
                       draw(st.integers(0, 2**63)), shown)
    return m, name


def render_mapping(m: fstext.Mapping) -> bytes:
    head = (b"%08x-%08x %s %08x %02x:%02x %d " % (m.start, m.end, m.perms, m.offset, *m.dev,
                                                   m.inode))
    if m.name:
        head = head.ljust(72) + b" " + m.name  # seq_setwidth(25 + 8 * 6 - 1), seq_pad(' ')
    return head + b"\n"


@settings(max_examples=300, deadline=None)
@given(st.lists(mappings(), min_size=1, max_size=8), st.lists(st.integers(0, 10**6)))
def test_maps_lines_parse_back_exactly(ms: list[tuple[fstext.Mapping, bytes]],
                                       cuts: list[int]) -> None:
    text = b"".join(render_mapping(m) for m, _name in ms)
    got = [fstext.parse_mapping(line) for line in fstext.lines(chunked(text, cuts))]
    assert got == [m for m, _name in ms]
    for m, name in ms:
        if b"\\" not in name:  # maps leaves a backslash alone: only then is it reversible
            assert fstext.unescape(m.name) == name


def test_map_file_names_have_no_leading_zeros() -> None:
    m = fstext.parse_mapping(b"00400000-00401000 r-xp 00000000 fd:01 42 /bin/x")
    assert m is not None and m.map_file == "400000-401000" and m.dev == (253, 1)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**62), st.integers(0, 0o77777777), u32, st.integers(0, 2**63),
       st.lists(st.tuples(st.integers(0, 99999), st.one_of(abs_path(), path_bytes(1))),
                max_size=6, unique_by=lambda t: t[0]),
       st.lists(st.integers(0, 10**6)))
def test_fdinfo_and_io_uring_files_parse_back_exactly(
        pos: int, flags: int, mnt_id: int, ino: int, files: list[tuple[int, bytes]],
        cuts: list[int]) -> None:
    head = b"pos:\t%d\nflags:\t0%o\nmnt_id:\t%d\nino:\t%d\n" % (pos, flags, mnt_id, ino)
    assert fstext.parse_fdinfo(head) == fstext.FdInfo(pos, flags, mnt_id, ino)
    files = sorted(files)
    ring = (head + b"SqMask:\t0x3\nSQEs:\t1\n    0: opcode:NOP, fd:0, flags:0\nCQEs:\t0\n"
            b"SqThread:\t-1\nUserFiles:\t%d\n" % (len(files) + 3)
            + b"".join(b"%5u: " % slot + mangle(p) + b"\n" for slot, p in files)
            + b"UserBufs:\t1\n    0: 0x7f00/4096\nPollList:\n")
    got = fstext.uring_files(fstext.lines(chunked(ring, cuts)))
    assert got == fstext.UringFiles(len(files) + 3, tuple(files), True)
    assert fstext.uring_files(fstext.lines([head])) is None  # the ring's lock was taken


def test_a_line_the_kernel_did_not_write_is_no_mount() -> None:
    for line in (b"", b"garbage", b"x 1 0:1 / / rw - ext4 a rw", b"1 2 0:1 / / rw shared:1",
                 b"1 2 3 / / rw - ext4 a rw"):
        assert fstext.parse_mount(line) is None
    assert fstext.parse_mapping(b"zz-1 r--p 0 00:00 0") is None

"""monarch/wire/monarch_wire.h is the C definition of the wire; protocol.py is Python's.
Every constant of the header must equal Python's, and both C libraries must include it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from monarch import protocol, routes
from monarch.node.stage import blocks
from monarch.node.tiers import tiers
from monarch.writeback import marks as wb_marks
from monarch.writeback import wire as wb_wire

WIRE = Path(protocol.__file__).parent / "wire" / "monarch_wire.h"
DEFINE = re.compile(r"^#define MONARCH_(\w+)[ \t]+(.+?)\s*(?:/\*.*)?$", re.M)

# header name -> the Python value it must equal (every plain constant of the header is listed)
PYTHON = {name: getattr(protocol, name) for name in (
    "COUNTERS_MAGIC", "COUNTERS_VERSION", "MAX_SLOTS", "HEADER_WORDS", "SLOT_WORDS", "EXTRA_WORDS", "SLOT_PFS",
    "SLOT_PEER", "FIRST_TIER_SLOT", "EXTRA_META_LOCAL", "EXTRA_META_PFS", "EXTRA_META_OFF", "EXTRA_ZSTD_OPENS", "EXTRA_ZSTD_NS",
    "EXTRA_ZSTD_BYTES", "EXTRA_ZSTD_FALLBACKS", "EXTRA_PROCESSES", "EXTRA_ZSTD_REUSED", "EXTRA_EARLY_OPENS", "EXTRA_EARLY_META", "EXTRA_LOST_OPENS",
    "EXTRA_LOST_META", "ENV_SHIM_ZSTD", "ENV_MAP_GUARD", "VERB_OPEN",
    "VERB_INVALIDATE", "VERB_ATTACH", "VERB_REPORT", "VERB_STOP", "VERB_HINT", "VERB_INDEX", "HINT_PROGRESS", "INDEX_READY",
    "INDEX_NONE", "INDEX_WALKING", "INDEX_POLL", "STATUS_PENDING", "STATUS_ERROR", "ANSWER_FD", "REQUEST_KEEP", "ANSWER_KEPT", "MEMFD_SEALS", "MAX_REQUEST", "MAX_ANSWER",
    "HEARTBEAT_MS", "HEARTBEAT_TIMEOUT_MS", "SHIM_TIMEOUT_MS_DEFAULT", "SHIM_INDEX_WAIT_MS_DEFAULT", "ENV_ROOTS",
    "ENV_PROBE", "ENV_SOCKET", "ENV_COUNTERS", "ENV_INDEX", "ENV_ASK_FIRST", "ENV_STORE_ROOTS", "ENV_SHARED_SLOTS", "ENV_DISABLE", "ENV_INDEX_WAIT",
    "INDEX_MAGIC", "INDEX_VERSION", "INDEX_DESCRIBING", "INDEX_SHORT_ROOM", "INDEX_SHORT_MAX_SIZE", "INDEX_SHORT_SIZE_BITS", "INDEX_SHORT_TIMES_AT",
    "INDEX_SHORT_ROUTE_AT", "INDEX_SHORT_BLOCKS_AT", "INDEX_SHORT_INO_AT", "INDEX_SHORT_INO_BITS", "INDEX_SHAPE_WRITING", "INDEX_SHAPE_READY", "INDEX_INOS_ONE", "INDEX_FLAG_SYMLINK", "INDEX_FLAG_LISTED", "INDEX_FLAG_UNDESCRIBED", "VERB_DESCRIBE", "INDEX_ROUTE_SHIFT", "INDEX_ROUTE_MASK",
    "EXTRA_BLOCK_LOCAL_BYTES",
    "EXTRA_BLOCK_PFS_BYTES", "EXTRA_BLOCK_OPENS", "EXTRA_BLOCK_REMAPPED_BYTES", "EXTRA_BLOCK_FAULTS_HELD",
    "EXTRA_BLOCK_FAULT_WAIT_NS", "EXTRA_BLOCK_FAULTS_LATE", "EXTRA_BLOCK_FAULTS_PAGES", "VERB_PAGES", "PAGES_MAX",
    "EXTRA_FALLBACKS", "EXTRA_ROOTS_ELSEWHERE", "EXTRA_ROOT_PROCESSES", "EXTRA_META_UNCHECKED", "EXTRA_RAW_CALLS",
    "EXTRA_RAW_NS", "EXTRA_RAW_PAUSES", "EXTRA_RAW_BY_CALL", "RAW_NRS", "INDEX_LISTING", "FALLBACK_ROOT_ELSEWHERE", "FALLBACK_TIERS_UNSEEN",
    "FALLBACK_DAEMON_UNREACHABLE", "FALLBACK_UID_MISMATCH", "FALLBACK_RAW_UNWATCHED", "FALLBACK_WB_LOST", "ENV_RAW_SYSCALLS", "ENV_ROOT_IDS", "ENV_PROBE_IDS", "ENV_SAID",
    "VERB_WB", "ENV_WRITEBACK", "ENV_WRITEBACK_MARKS", "ENV_WRITEBACK_SOCKET",
    "ANSWER_BLOCKS")}
# the block map's format is its writer's (node/stage/blocks.py)
PYTHON |= {name: getattr(blocks, name) for name in (
    "BLOCKS_DIR", "BLOCKMAP_DIR", "BLOCKMAP_MAGIC", "BLOCKMAP_VERSION", "BLOCK_ABSENT", "BLOCK_WANTED", "BLOCK_STAGED", "BLOCK_FILLING",
    "BLOCK_PLANNED", "BLOCK_PASSED", "BLOCK_LENT", "RECORDS_YES", "RECORDS_NO")}
# a write-back call's ops and answers (writeback/wire.py)
PYTHON |= {name: getattr(wb_wire, name) for name in (
    "WB_OPEN", "WB_CLOSE", "WB_RESOLVE", "WB_RENAME", "WB_UNLINK", "WB_MKDIR", "WB_RMDIR", "WB_SYNC", "WB_LIST",
    "WB_SETTLE", "WB_FMODE", "WB_ROOM", "WB_SPILLED", "WB_CLOSE_SYNCED", "WB_ANSWER_PFS", "WB_ANSWER_DONE", "WB_ANSWER_SPILL", "WB_ANSWER_LOCAL", "WB_ERRNO", "RESOLVE_TO_READ")}
PYTHON["WB_RESOLVE_TO_READ"] = PYTHON.pop("RESOLVE_TO_READ")
PYTHON |= {"WB_MARKS_MAGIC": wb_marks.MAGIC.decode(), "WB_MARKS_HEADER_SIZE": wb_marks.HEADER.size}
PYTHON |= {f"WB_SETTLE_{kind}": getattr(wb_wire, f"SETTLE_{kind}") for kind in ("OTHER", "TRUNCATE", "CHMOD")}
# the route table's size thresholds (monarch/routes.py; its rows are tests/unit/test_routes.py's)
PYTHON |= {name: getattr(routes, name) for name in ("INLINE_MAX", "BLOCKS_MIN", "RANGES_MIN", "ONE_MESSAGE_MAX", "SIZE_ANY")}
PYTHON |= {
    "COUNTERS_WORDS": protocol.COUNTERS_SIZE // 8,
    "REQUEST_HEADER_SIZE": protocol.REQUEST_HEADER.size,
    "HINT_PROGRESS_BODY": protocol.HINT_HEADER.size + 8,
    "ANSWER_HEADER_SIZE": protocol.ANSWER_HEADER.size,
    "INDEX_HEADER_SIZE": protocol.INDEX_HEADER.size,
    "BLOCKMAP_HEADER_SIZE": blocks.BLOCKMAP_HEADER.size,
    "INDEX_ENTRY_SIZE": protocol.INDEX_ENTRY.size,
    "INDEX_FILE_SIZE": protocol.INDEX_FILE.size,
    "INDEX_CHILD_SIZE": protocol.INDEX_CHILD.size,
    "TMP_PREFIX": tiers.TMP_PREFIX,
    "ENV_DEBUG": "MONARCH_SHIM_DEBUG",      # read by the shim alone
    "ENV_TIMEOUT": "MONARCH_SHIM_TIMEOUT_MS",
}


def c_value(text: str, known: dict):
    if text.startswith('"'):
        return text.strip('"')
    expr = re.sub(r"(?<=[0-9A-Fa-f])[uUlL]+\b", "", text)
    expr = re.sub(r"MONARCH_(\w+)", lambda m: str(known[m.group(1)]), expr)
    return eval(expr, {"__builtins__": {}})  # the header's own arithmetic: numbers, + * << ( )


@pytest.fixture(scope="module")
def header() -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in DEFINE.findall(WIRE.read_text()):
        if name != "WIRE_H":
            out[name] = c_value(value, out)
    return out


def test_every_constant_of_the_header_equals_pythons(header):
    assert set(header) == set(PYTHON), "a constant in one language only: add it to both (and to PYTHON here)"
    for name, value in header.items():
        assert value == PYTHON[name], f"MONARCH_{name} = {value!r} in monarch_wire.h, {PYTHON[name]!r} in Python"


@pytest.mark.parametrize("source", ["shim/monarch_shim.c", "frontdoor/front_door.c"])
def test_both_c_libraries_include_the_one_header_and_define_no_wire_constant_themselves(source, header):
    main = Path(protocol.__file__).parent / source
    text = main.read_text()
    own = main.with_suffix(".h")  # the shim's core includes it through the header its parts share
    assert '#include "../wire/monarch_wire.h"' in text + (own.read_text() if own.exists() else "")
    text += "".join(p.read_text() for p in sorted(main.parent.glob("*.[ch]")) if p != main)  # its parts and their headers
    mine = set(re.findall(r"^#define (?:MONARCH_)?(\w+)", text, re.M))
    assert not mine & set(header), f"{source} redefines {sorted(mine & set(header))}"


def test_the_structs_hold_pythons_layout(tmp_path):
    """The header's _Static_asserts compile: sizes and offsets are what protocol.py packs."""
    src = tmp_path / "w.c"
    src.write_text(f'#include "{WIRE}"\nint main(void) {{ return 0; }}\n')
    r = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-c", str(src), "-o", str(tmp_path / "w.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

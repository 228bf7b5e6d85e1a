"""protocol.py is the contract; monarch_shim.c mirrors it by hand. Keep them equal."""

from __future__ import annotations

import re
import struct

import pytest

from monarch import protocol
from monarch.shim.build import SOURCE

# C macro (without the MONARCH_ prefix) -> protocol.py name
MIRRORED = {
    "COUNTERS_MAGIC": "COUNTERS_MAGIC",
    "COUNTERS_VERSION": "COUNTERS_VERSION",
    "MAX_SLOTS": "MAX_SLOTS",
    "HEADER_WORDS": "HEADER_WORDS",
    "SLOT_PFS": "SLOT_PFS",
    "SLOT_PEER": "SLOT_PEER",
    "FIRST_TIER_SLOT": "FIRST_TIER_SLOT",
    "SHIM_TIMEOUT_MS_DEFAULT": "SHIM_TIMEOUT_MS_DEFAULT",
    "ENV_ROOTS": "ENV_ROOTS",
    "ENV_PROBE": "ENV_PROBE",
    "ENV_SOCKET": "ENV_SOCKET",
    "ENV_COUNTERS": "ENV_COUNTERS",
    "ENV_DISABLE": "ENV_DISABLE",
}

DEFINE = re.compile(r"^#define MONARCH_(\w+)[ \t]+(.+?)\s*$", re.M)


def c_value(text: str):
    if text.startswith('"'):
        return text.strip('"')
    return int(re.sub(r"[uUlL]+$", "", text), 0)


@pytest.fixture(scope="module")
def c_defines() -> dict[str, object]:
    out = {}
    for name, value in DEFINE.findall(SOURCE.read_text()):
        try:
            out[name] = c_value(value)
        except ValueError:
            pass  # function-like or computed macros
    return out


@pytest.mark.parametrize("c_name,py_name", MIRRORED.items())
def test_c_mirror_equals_protocol(c_defines, c_name, py_name):
    assert c_name in c_defines, f"monarch_shim.c lacks #define MONARCH_{c_name}"
    assert c_defines[c_name] == getattr(protocol, py_name), f"MONARCH_{c_name} differs from protocol.{py_name}"


def test_debug_and_timeout_env_names_documented(c_defines):
    assert c_defines["ENV_DEBUG"] == "MONARCH_SHIM_DEBUG"
    assert c_defines["ENV_TIMEOUT"] == "MONARCH_SHIM_TIMEOUT_MS"
    assert "MONARCH_SHIM_DEBUG" in protocol.__doc__ and "MONARCH_SHIM_TIMEOUT_MS" in protocol.__doc__


def test_counters_layout():
    assert protocol.COUNTERS_SIZE == 8 * (protocol.HEADER_WORDS + 2 * protocol.MAX_SLOTS)
    assert protocol.MAX_TIERS == protocol.MAX_SLOTS - protocol.FIRST_TIER_SLOT
    assert protocol.tier_slot(0) == protocol.FIRST_TIER_SLOT
    assert protocol.SLOT_PFS == 0 and protocol.SLOT_PEER == 1
    # the shim's fd table stores slot + 1 in a uint8_t
    assert protocol.MAX_SLOTS < 255


def test_counters_roundtrip(tmp_path):
    path = str(tmp_path / "c")
    protocol.create_counters(path)
    raw = bytearray(open(path, "rb").read())
    assert len(raw) == protocol.COUNTERS_SIZE
    assert protocol.read_counters(path) == [(0, 0)] * protocol.MAX_SLOTS
    # what the shim does: little-endian adds at word HEADER_WORDS + 2*slot (+1 for bytes)
    for slot, opens, nbytes in [(0, 3, 1000), (2, 1, 7), (15, 9, 2**40)]:
        struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + 2 * slot), opens)
        struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + 2 * slot + 1), nbytes)
    open(path, "wb").write(raw)
    counts = protocol.read_counters(path)
    assert counts[0] == (3, 1000) and counts[2] == (1, 7) and counts[15] == (9, 2**40)
    assert counts[1] == (0, 0)


def test_read_counters_rejects_foreign_file(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(b"\0" * protocol.COUNTERS_SIZE)
    with pytest.raises(ValueError, match="not a Monarch counters file"):
        protocol.read_counters(str(path))


@pytest.mark.parametrize("slot,path", [(0, ""), (2, "/tier/0/a b.jpg"), (1, "/peer/0/x")])
def test_answer_roundtrip(slot, path):
    line = protocol.format_answer(slot, path)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.parse_answer(line) == (slot, path)


def test_pfs_answer_is_what_the_shim_parses():
    # the shim expects "<digits> <path>\n"; slot 0 carries an empty path
    assert protocol.format_answer(protocol.SLOT_PFS) == b"0 \n"

"""The declared keys written out for people: `monarch check-config`'s listing and the table of
docs/configuration.md."""

from __future__ import annotations

import json
from typing import Any

from monarch.config.keys import KEYS, TIER_KEYS, Key
from monarch.config.model import Config

TABLE_BEGIN = "<!-- keys: generated from monarch/config/keys.py by scripts/config_table.py; a test checks it -->"
TABLE_END = "<!-- end keys -->"
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size_text(n: int) -> str:
    """Bytes as people write them: ``4GiB`` when exact, else the plain number."""
    for unit, scale in _BINARY:
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def yaml_text(value: Any) -> str:
    """A default as written in defaults.yaml."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return str(value)


def value_text(key: Key, fields: dict[str, Any]) -> str:
    """A checked value (the dataclass fields of ``key``) as people write it."""
    if len(key.fields) == 2:  # an amount: bytes, or a share
        amount, share = fields.values()
        return f"{share * 100:g}%" if share is not None else size_text(amount)
    value = fields[key.fields[0]]
    if key.show is not None:
        return key.show(value)
    if isinstance(value, tuple):
        return ", ".join(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and "size" in key.kind:
        return size_text(value)
    return yaml_text(value)


def _given(user: dict, path: list[str]) -> bool:
    """Whether the user's mapping sets the key at ``path``."""
    node: Any = user
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def listing(config: Config, user: dict, source: str) -> list[tuple[str, str, str]]:
    """(key, value, where it came from: ``source`` or "default") for every declared key, tiers one by one."""
    rows: list[tuple[str, str, str]] = []
    for key in KEYS:
        if key.per_tier:
            if key is TIER_KEYS[0]:
                rows += _tier_rows(config, user, source)
            continue
        obj = getattr(config, key.section) if key.section else config
        fields = {f: getattr(obj, f) for f in key.fields}
        rows.append((key.path, value_text(key, fields), source if _given(user, key.path.split(".")) else "default"))
    return rows


def _tier_rows(config: Config, user: dict, source: str) -> list[tuple[str, str, str]]:
    given = user.get("tiers") if isinstance(user.get("tiers"), list) else None
    rows = []
    for i, tier in enumerate(config.tiers):
        for key in TIER_KEYS:
            fields = {f: getattr(tier, f) for f in key.fields}
            origin = source if given is not None and key.name in given[i] else "default"
            rows.append((f"tiers[{i}].{key.name}", value_text(key, fields), origin))
    return rows


def table() -> str:
    """docs/configuration.md's table of keys: one row per declared key, its default and its doc."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key in KEYS:
        values = key.shipped or (key.default,)  # a tier key: each shipped tier's value
        default = ", ".join(f"`{yaml_text(v)}`" for v in values)
        lines.append(f"| `{key.path}` | {default} | {key.doc} |")
    return "\n".join(lines)


def readme_with_table(readme: str) -> str:
    """``readme`` (docs/configuration.md's text) with the text between the table's markers
    replaced by ``table()``."""
    begin, end = readme.index(TABLE_BEGIN) + len(TABLE_BEGIN), readme.index(TABLE_END)
    return readme[:begin] + "\n" + table() + "\n" + readme[end:]

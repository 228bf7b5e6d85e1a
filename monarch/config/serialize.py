"""The checked configuration as JSON, and the part of it a daemon serves.

``monarch run`` loads and checks the configuration once (``load.py``); the daemon it starts
receives that checked configuration as JSON (``to_json``) and rebuilds the same frozen
dataclasses (``from_json``), never reading the user's file again. A running daemon says what
it serves (``served``) and a launcher reuses it only when that equals its own; ``differences``
names the keys that are not, for the line that says why.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from monarch.config.model import Config, DatasetConfig, PeerConfig, StagingConfig, TierConfig, WritebackConfig
from monarch.errors import ConfigError

__all__ = ["differences", "from_json", "served", "to_json"]

# what does not change what a daemon does: where the configuration came from (for messages),
# the reports (each launcher writes its own run's; a standing daemon its job's), the file's own
# peer section (a launcher's question: is this a cluster run?) and run_base (a launcher finds the
# daemon's socket in it: equal whenever there is a daemon to compare)
_NOT_SERVED = ("source", "report", "report_html", "peer_given", "run_base")


def to_json(config: Config) -> str:
    """Every field of ``config``, as JSON (``from_json`` rebuilds an equal one)."""
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def from_json(text: str | bytes) -> Config:
    """The configuration ``to_json`` wrote; ConfigError if ``text`` is not one."""
    try:
        data = json.loads(text)
        dataset = data.pop("dataset")
        writeback = data.pop("writeback")
        return Config(dataset=DatasetConfig(roots=tuple(dataset["roots"]), given=tuple(dataset["given"]),
                                            stores=tuple(tuple(s) for s in dataset["stores"]),
                                            manifest=dataset.get("manifest", "")),
                      tiers=tuple(TierConfig(**t) for t in data.pop("tiers")),
                      staging=StagingConfig(**data.pop("staging")), peer=PeerConfig(**data.pop("peer")),
                      writeback=WritebackConfig(**{**writeback, "paths": tuple(writeback["paths"])}), **data)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(f"not a checked configuration written by monarch run ({type(e).__name__}: {e}); "
                          "start the daemon with monarch run, or monarch serve -c CONFIG") from None


def served(config: Config) -> dict[str, Any]:
    """What of ``config`` changes what a daemon does (tiers, staging, peer, the dataset, the
    memory margin, the write-back), as plain JSON values. The dataset is its canonical roots and the store
    each is served from: a root spelt another way (a symlink on the way) is the same root."""
    out = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _NOT_SERVED}
    out = json.loads(json.dumps({k: _plain(v) for k, v in out.items()}))
    out["dataset"] = {"roots": list(config.dataset.roots), "manifest": config.dataset.manifest,
                      "stores": {str(k): url for k, url in sorted(config.dataset.store_urls().items())}}
    return out


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else \
        [_plain(v) for v in value] if isinstance(value, tuple) else value


def differences(there: Any, here: Any, names: tuple[str, str] = ("there", "here"), key: str = "") -> list[str]:
    """The keys whose values differ between two ``served`` records, one line each, the values
    named by ``names``: ``tiers[0].capacity: 1073741824 there, 2147483648 here``."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [line for k in sorted(set(there) | set(here), key=str)
                for line in differences(there.get(k), here.get(k), names, f"{key}.{k}" if key else str(k))]
    if isinstance(there, list) and isinstance(here, list) and len(there) == len(here) \
            and all(isinstance(v, dict) for v in there + here):
        return [line for i, (a, b) in enumerate(zip(there, here)) for line in differences(a, b, names, f"{key}[{i}]")]
    if there == here:
        return []
    return [f"{key or 'the configuration'}: {json.dumps(there)} {names[0]}, {json.dumps(here)} {names[1]}"]

"""Rewrite docs/configuration.md's configuration table from the declared keys (monarch/config/keys.py) and its
environment table from the declared variables (monarch/environment.py).

Run after adding or changing a key or a variable: ``python3 scripts/config_table.py``. Tests
(tests/unit/config/test_config_keys.py, tests/unit/test_environment.py) fail while a table there differs
from the declarations. ``--check`` writes nothing: exit 1 when a table is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from monarch import environment  # noqa: E402
from monarch.config.docs import readme_with_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the table is out of date")
    args = p.parse_args(argv)
    readme = REPO / "docs" / "configuration.md"
    old = readme.read_text()
    new = environment.readme_with_table(readme_with_table(old))
    if new == old:
        print(f"{readme}: table up to date")
        return 0
    if args.check:
        print(f"{readme}: table out of date; run python3 scripts/config_table.py to rewrite it")
        return 1
    readme.write_text(new)
    print(f"{readme}: table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())

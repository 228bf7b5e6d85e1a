"""Rewrite README.md's configuration table from the declared keys (monarch/config/keys.py).

Run after adding or changing a key: ``python3 scripts/config_table.py``. A test
(tests/unit/test_config_keys.py) fails while the README's table differs from the declarations.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from monarch.config.docs import readme_with_table  # noqa: E402


def main() -> int:
    readme = REPO / "README.md"
    old = readme.read_text()
    new = readme_with_table(old)
    if new != old:
        readme.write_text(new)
    print(f"{readme}: {'table rewritten' if new != old else 'table up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

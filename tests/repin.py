"""Recompute the pinned batch digests of tests/test_search_planning.py and write them
into its ``PINNED`` table. Run it after a change that is meant to move them, and say in
the commit which digests moved and why (the table's history is in git).

    .venv/bin/python tests/repin.py           # rewrite the table
    .venv/bin/python tests/repin.py --check   # exit 1, naming the rows, if it is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST = HERE / "test_search_planning.py"
TABLE = re.compile(r"^PINNED = \{\n.*?^\}\n", re.S | re.M)


def computed() -> dict[tuple[str, int], tuple[str, int, int]]:
    """Every pinned (kind, seed) collected now: (digest, actor rows, critic rows)."""
    sys.path.insert(0, str(HERE))
    import test_search_planning as pins

    out = {}
    for kind, seed in sorted(pins.PINNED):
        col, tasks = pins.collection(kind, seed)
        batch = pins.run(col.collect(tasks))
        out[(kind, seed)] = (pins.digest(batch), len(batch.actor), len(batch.critic))
    return out


def table(rows: dict[tuple[str, int], tuple[str, int, int]]) -> str:
    body = "".join(f"    {key!r}: {value!r},\n" for key, value in sorted(rows.items()))
    return "PINNED = {\n" + body.replace("'", '"') + "}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if the table is out of date")
    args = ap.parse_args(argv)
    text = TEST.read_text(encoding="utf-8")
    if not TABLE.search(text):
        raise SystemExit(f"no PINNED table in {TEST}")
    new = table(computed())
    if args.check:
        same = TABLE.search(text).group(0) == new  # type: ignore[union-attr]
        print("pinned digests are up to date" if same else f"pinned digests moved; now:\n{new}")
        return 0 if same else 1
    TEST.write_text(TABLE.sub(lambda _: new, text, count=1))
    print(new, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

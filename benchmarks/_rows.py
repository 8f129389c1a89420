"""The benchmarks' common result format and printer.

Every benchmark module has ``bench(quick: bool = False) -> list[dict]``: one row per target,
``{"name", "value", "unit", "target", "pass", "detail"}`` (``detail``: the figures behind the value,
the baseline measured in the same run). ``benchmarks/run.py`` (``make bench``) runs them all; each
module also runs alone (``python benchmarks/x.py [--quick] [--json]``) through :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


def line(r: dict) -> str:
    """One row as the report prints it: verdict, name, value with unit, target, then the detail."""
    return (f"{'PASS' if r['pass'] else 'FAIL'}  {r['name']}: {r['value']} {r['unit']} (target {r['target']})"
            f"\n      {r['detail']}")


def main(bench: Callable[..., list[dict]], doc: str | None) -> int:
    """Run one benchmark module's ``bench`` from its command line; exit 1 on any FAIL."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions (for development)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    args = ap.parse_args()
    rows = bench(quick=args.quick)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(line(r))
    return 0 if rows and all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit("benchmarks/_rows.py is imported by the benchmarks; run benchmarks/run.py")

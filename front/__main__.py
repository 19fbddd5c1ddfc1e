"""Run the front: `python -m front --host 127.0.0.1 --port 8000` (port 0 picks a free one).

Prints one line, `front listening on http://HOST:PORT`, then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from front.server import serve


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m front", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return serve(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())

"""Rows of text for the echo case study (examples/real/seed_echo.yaml) from Debian's fortunes.

    python examples/real/seed_fortunes.py [OUT.jsonl] [--files fortunes humorists ...] [--rows N]

Reads ``/usr/share/games/fortunes/<file>`` (Debian package ``fortunes``; ``fortunes-min`` has
only ``fortunes``), splits it at ``%`` lines, joins each fortune's lines with spaces, keeps
those of at least 200 characters, shuffles them with a fixed seed and writes ``N`` rows as
the ``dataset:`` JSONL format (``{"id": ..., "prompt": ...}``).  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FOLDER = Path("/usr/share/games/fortunes")


def fortunes(files: list[str], min_chars: int = 200) -> list[str]:
    out = []
    for name in files:
        text = (FOLDER / name).read_text(encoding="utf-8", errors="replace")
        for block in text.split("\n%\n"):
            one = " ".join(line.strip() for line in block.splitlines() if line.strip())
            if len(one) >= min_chars:
                out.append(one)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(Path(__file__).with_name("seed_fortunes.jsonl")))
    ap.add_argument("--files", nargs="+", default=["fortunes", "humorists", "computers", "science", "literature"])
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = fortunes(args.files)
    random.Random(args.seed).shuffle(rows)
    with open(args.out, "w", encoding="utf-8") as f:
        for i, text in enumerate(rows[:args.rows]):
            f.write(json.dumps({"id": f"fortune-{i}", "prompt": text}) + "\n")
    print(f"wrote {min(len(rows), args.rows)} of {len(rows)} fortunes to {args.out}")


if __name__ == "__main__":
    main()

"""Text files -> documents -> fixed-length token windows (BOS first when the tokenizer has one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from circuitgraph.errors import LoadError

if TYPE_CHECKING:
    from circuitgraph.adapters.tokenizer import Tokenizer

__all__ = ["read_documents", "token_windows", "split_windows"]


def read_documents(paths: list[Path], text_field: str = "text") -> list[str]:
    """Documents of plain text (``%`` lines separate documents, as in fortune files), JSONL rows
    (``text_field``) or Parquet files (the ``text_field`` column)."""
    docs: list[str] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise LoadError(f"text file {path} does not exist; fix train.text")
        if path.suffix == ".jsonl":
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                    raise LoadError(f"{path}:{i + 1}: not a JSON object ({why}); write one JSON object per "
                                    "line") from None
                if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                    raise LoadError(f"{path}:{i + 1}: a row needs a string field {text_field!r}; fix the row "
                                    "or set train.text_field")
                docs.append(row[text_field])
        elif path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise LoadError(f"{path}: reading Parquet needs pyarrow; pip install 'circuitgraph-lm[dataset]'") from None
            table = pq.read_table(path)
            if text_field not in table.column_names:
                raise LoadError(f"{path}: no column {text_field!r} (it has {table.column_names}); set train.text_field")
            docs.extend(str(t) for t in table.column(text_field).to_pylist() if t)
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
            parts, cur = [], []
            for line in text.splitlines():
                if line.strip() == "%":
                    parts.append("\n".join(cur))
                    cur = []
                else:
                    cur.append(line)
            parts.append("\n".join(cur))
            docs.extend(p.strip() for p in parts if p.strip())
    if not docs:
        raise LoadError(f"no text in {[str(p) for p in paths]}; give files with text")
    return docs


def token_windows(docs: list[str], tokenizer: Tokenizer, context: int, *, bos_id: int | None) -> torch.Tensor:
    """``(n_windows, context)`` token ids: the documents tokenised and joined (separated by the
    BOS token when there is one), cut into pieces of ``context - 1`` tokens each led by BOS, or of
    ``context`` tokens when the tokenizer has no BOS.  The tail shorter than a window is dropped."""
    stream: list[int] = []
    for d in docs:
        ids = list(tokenizer.encode(d))
        if bos_id is not None and stream:
            stream.append(bos_id)
        stream.extend(ids)
    body = context - 1 if bos_id is not None else context
    n = len(stream) // body
    if n == 0:
        raise LoadError(f"the text gives {len(stream)} tokens, fewer than one window of {body}; give more text "
                        "or a smaller train.context")
    t = torch.tensor(stream[: n * body], dtype=torch.long).reshape(n, body)
    if bos_id is not None:
        t = torch.cat([torch.full((n, 1), bos_id, dtype=torch.long), t], dim=1)
    return t


def split_windows(windows: torch.Tensor, eval_windows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, held_out)``: a seeded permutation of the windows, the last ``eval_windows`` held out
    (at least one window is left for training)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(windows), generator=g)
    k = min(eval_windows, len(windows) - 1)
    if k < 1:
        raise LoadError(f"{len(windows)} window(s) of text: too few to hold some out; give more text")
    return windows[perm[:-k]], windows[perm[-k:]]

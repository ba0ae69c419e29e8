"""A minimal tokenizer interface over Hugging Face tokenizer files or a HF tokenizer object.

circuitgraph only needs: text -> ids (without special tokens), the BOS id, and id -> string.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from circuitgraph.errors import LoadError, TokenError

__all__ = ["Tokenizer", "resolve_tokenizer_dir"]


def resolve_tokenizer_dir(path: Path) -> Path | None:
    """``DIR/tokenizer`` may be a directory or a small text file holding a relative path to one
    (a symlink flattened by a copy).  Returns the directory, or None if there is none."""
    if path.is_dir():
        return path
    if path.is_file() and path.stat().st_size < 4096:
        target = (path.parent / path.read_text().strip()).resolve()
        if target.is_dir():
            return target
        raise LoadError(f"{path} points to {target}, which is not a tokenizer directory")
    return None


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` (from files) or a transformers tokenizer (from a hub model)."""

    def __init__(self, backend: Any, *, bos_id: int | None, kind: str, source: str = ""):
        self.backend = backend
        self.bos_id = bos_id
        self.kind = kind
        self.source = source

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        import tokenizers

        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise LoadError(f"tokenizer directory {path} has no tokenizer.json (Hugging Face fast-tokenizer file)")
        backend = tokenizers.Tokenizer.from_file(str(file))
        bos_token = None
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            f = path / name
            if f.is_file():
                data = json.loads(f.read_text())
                tok = data.get("bos_token")
                if isinstance(tok, dict):
                    tok = tok.get("content")
                if tok:
                    bos_token = tok
                    break
        bos_id = backend.token_to_id(bos_token) if bos_token else None
        return cls(backend, bos_id=bos_id, kind="files", source=str(path))

    @classmethod
    def from_hf(cls, hf_tokenizer: Any) -> "Tokenizer":
        return cls(hf_tokenizer, bos_id=hf_tokenizer.bos_token_id, kind="hf",
                   source=str(getattr(hf_tokenizer, "name_or_path", "")))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        if self.kind == "files":
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        return list(self.backend.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids))

    def token_str(self, token_id: int) -> str:
        """Readable string of one token (as decoded; falls back to the vocab entry)."""
        text = self.decode([int(token_id)])
        if text == "" and self.kind == "files":
            text = self.backend.id_to_token(int(token_id)) or ""
        if text == "":
            conv = getattr(self.backend, "convert_ids_to_tokens", None)
            if conv is not None:
                text = conv(int(token_id)) or ""
        return text

    @property
    def unk_id(self) -> int | None:
        """The id of the unknown token (what words outside the vocabulary encode to), if any."""
        if self.kind == "files":
            token = getattr(self.backend.model, "unk_token", None)
            return self.backend.token_to_id(token) if token else None
        return getattr(self.backend, "unk_token_id", None)

    def single_token(self, text: str, where: str = "token") -> int:
        """The id of ``text`` if it is exactly one token; otherwise a TokenError saying how it splits.

        A word the tokenizer only knows as its unknown token is not a token of the vocabulary.
        """
        ids = self.encode(text)
        if len(ids) == 1:
            unk = self.unk_id
            if unk is not None and ids[0] == unk and text.strip() != self.token_str(unk).strip():
                raise TokenError(f"{where} {text!r} is not in the vocabulary (the tokenizer encodes it as its unknown "
                                 f"token {self.token_str(unk)!r}, id {unk}); use a token of the vocabulary")
            return ids[0]
        if not ids:
            raise TokenError(f"{where} {text!r} encodes to no token at all; use a non-empty token string")
        pieces = [self.token_str(i) for i in ids]
        raise TokenError(
            f"{where} {text!r} is not a single token: it splits into {len(ids)} tokens {pieces!r} "
            f"(ids {ids}); use one of those tokens or give a token id"
        )

"""A minimal tokenizer interface over Hugging Face tokenizer files or a HF tokenizer object.

circuitgraph only needs: text -> ids (without special tokens), the BOS id, and id -> string;
and, so that no token string silently becomes something else, the unknown token, the
pieces of a text the tokenizer does not know, and the vocabulary entries nearest a string.

A token *string* (a target, a metric, a logit-lens or congruence token) must be exactly one
token that is not the unknown token (unless the string is that token's own text) and that
decodes back to the string (up to leading spaces, which some tokenizers add or drop); anything
else is a :class:`~circuitgraph.errors.TokenError` naming the nearest vocabulary entries.
A prompt *text* may contain unknown pieces: :meth:`Tokenizer.unknown_pieces` names them.
"""

from __future__ import annotations

import difflib
import heapq
import json
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from circuitgraph._io import MAX_JSON_BYTES, read_json_file
from circuitgraph.errors import LoadError, TokenError, UnknownTokenWarning

__all__ = ["Tokenizer", "resolve_tokenizer_dir", "check_prompt_text", "prompt_ids", "prompt_fields", "PromptFields"]

#: how many vocabulary entries an error about an unknown token string suggests
N_NEAREST = 5


def resolve_tokenizer_dir(path: Path) -> Path | None:
    """``DIR/tokenizer`` may be a directory or a small text file holding a relative path to one
    (a symlink flattened by a copy).  Returns the directory, or None if there is none."""
    if path.is_dir():
        return path
    if path.is_file() and path.stat().st_size < 4096:
        try:
            pointer = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise LoadError(f"{path} is neither a tokenizer folder nor a text file naming one") from None
        if not pointer or "\x00" in pointer:
            raise LoadError(f"{path} is neither a tokenizer folder nor a text file naming one")
        target = (path.parent / pointer).resolve()
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
        self._vocab_strs: list[str] | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        import tokenizers

        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise LoadError(f"tokenizer directory {path} has no tokenizer.json (Hugging Face fast-tokenizer file)")
        size = file.stat().st_size
        if size > MAX_JSON_BYTES * 8:
            raise LoadError(f"{file} is {size:,} bytes; a tokenizer file is at most {MAX_JSON_BYTES * 8:,} bytes")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception
            detail = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise LoadError(f"{file} is not a Hugging Face tokenizer file ({detail}); re-save it with "
                            "tokenizer.save(path)") from None
        bos_token = None
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            f = path / name
            if f.is_file():
                data = read_json_file(f, "tokenizer config")
                if not isinstance(data, dict):
                    raise LoadError(f"{f} must hold a JSON object")
                tok = data.get("bos_token")
                if isinstance(tok, dict):
                    tok = tok.get("content")
                if tok is not None and not isinstance(tok, str):
                    raise LoadError(f"{f}: bos_token must be a string or {{content: string}}, got {str(tok)[:60]}")
                if tok:
                    bos_token = tok
                    break
        bos_id = backend.token_to_id(bos_token) if bos_token else None
        return cls(backend, bos_id=bos_id, kind="files", source=str(path))

    @classmethod
    def from_hf(cls, hf_tokenizer: Any) -> Tokenizer:
        return cls(hf_tokenizer, bos_id=hf_tokenizer.bos_token_id, kind="hf",
                   source=str(getattr(hf_tokenizer, "name_or_path", "")))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenError(f"{text[:40]!r} holds {text[exc.start]!r} at character {exc.start}, a lone surrogate "
                             "that is not text; remove it") from None
        if self.kind == "files":
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        return list(self.backend.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], *, skip_special_tokens: bool | None = None) -> str:
        """Text of ``ids``; ``skip_special_tokens`` as the backend takes it (default: the backend's)."""
        if skip_special_tokens is None:
            return self.backend.decode(list(ids))
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

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
        """The id of the tokenizer's unknown token, or None if it has none."""
        if self.kind == "files":
            model = json.loads(self.backend.to_str()).get("model", {})
            if isinstance(model.get("unk_id"), int):  # Unigram
                return int(model["unk_id"])
            tok = model.get("unk_token")
            return self.backend.token_to_id(tok) if isinstance(tok, str) else None
        uid = getattr(self.backend, "unk_token_id", None)
        return int(uid) if uid is not None else None

    def _unk_text(self) -> str | None:
        uid = self.unk_id
        if uid is None:
            return None
        if self.kind == "files":
            return self.backend.id_to_token(uid)
        return getattr(self.backend, "unk_token", None)

    def _encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        if self.kind == "files":
            enc = self.backend.encode(text, add_special_tokens=False)
            return list(enc.ids), [tuple(o) for o in enc.offsets]
        try:
            out = self.backend(text, add_special_tokens=False, return_offsets_mapping=True)
            return list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]]
        except (NotImplementedError, TypeError, ValueError, KeyError):  # slow tokenizers have no offsets
            return self.encode(text), None

    def unknown_pieces(self, text: str) -> list[str]:
        """The pieces of ``text`` the tokenizer does not know: those it maps to its unknown token
        (unless the piece is that token's own text) and non-blank text it drops altogether.

        Example: a word-level tokenizer that knows " the" and " owl" gives ``[" zzz"]`` for
        ``"the zzz owl"``.
        """
        ids, offsets = self._encode_with_offsets(text)
        uid, unk_text = self.unk_id, self._unk_text()
        if offsets is None:  # no offsets: compare the round trip as a whole
            pieces = [f"<unknown piece {n + 1}>" for n, i in enumerate(ids) if i == uid]
            if self.decode(ids).split() != text.split() and not pieces:
                pieces = [text]
            return pieces
        pieces = []
        covered = [False] * len(text)
        for i, (a, b) in zip(ids, offsets, strict=False):
            for c in range(a, min(b, len(text))):
                covered[c] = True
            if i == uid and text[a:b].strip() != (unk_text or "").strip():
                pieces.append(text[a:b])
        gap = ""
        for c, ch in enumerate(text + " "):
            if c < len(text) and not covered[c]:
                gap += ch
            else:
                if gap.strip():
                    pieces.append(gap)
                gap = ""
        return pieces

    def vocabulary_strings(self) -> list[str]:
        """Every token id's readable string, in id order (computed once)."""
        if self._vocab_strs is None:
            if self.kind == "files":
                n = self.backend.get_vocab_size(with_added_tokens=True)
                self._vocab_strs = list(self.backend.decode_batch([[i] for i in range(n)]))
            else:
                n = len(self.backend)
                self._vocab_strs = list(self.backend.batch_decode([[i] for i in range(n)]))
        return self._vocab_strs

    def nearest(self, text: str, n: int = N_NEAREST) -> list[str]:
        """The ``n`` vocabulary entries most similar to ``text``, best first: ``difflib``'s ratio of
        the lower-cased, space-stripped strings, ties broken by the ratio of the strings as written."""
        target = text.strip().lower()
        matcher = difflib.SequenceMatcher(autojunk=False)
        matcher.set_seq2(target)
        best: list[tuple[float, float, str]] = []  # a min-heap of the n best (score, tie, entry)
        for entry in sorted({v for v in self.vocabulary_strings() if v.strip()}):
            matcher.set_seq1(entry.strip().lower())
            floor = best[0][0] if len(best) == n else -1.0
            if matcher.real_quick_ratio() < floor or matcher.quick_ratio() < floor:
                continue
            score = matcher.ratio()
            if score < floor:
                continue
            item = (score, difflib.SequenceMatcher(None, entry, text).ratio(), entry)
            if len(best) < n:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)
        return [entry for _, _, entry in sorted(best, reverse=True)]

    def _suggest(self, text: str) -> str:
        near = self.nearest(text)
        return f"nearest vocabulary entries: {', '.join(repr(v) for v in near)}" if near else "the vocabulary is empty"

    def single_token(self, text: str, where: str = "token") -> int:
        """The id of ``text`` if it is exactly one known token that decodes back to ``text``;
        otherwise a TokenError saying why, with the nearest vocabulary entries."""
        ids = self.encode(text)
        if not ids:
            raise TokenError(f"{where} {text!r} encodes to no token at all; use a non-empty token string")
        uid, unk_text = self.unk_id, self._unk_text()
        if uid is not None and uid in ids and text.strip() != (unk_text or "").strip():
            raise TokenError(
                f"{where} {text!r} is not in the tokenizer's vocabulary (it would become the unknown token "
                f"{unk_text!r}); {self._suggest(text)}; use one of those or give a token id"
            )
        if len(ids) == 1:
            back = self.decode(ids)
            if back == text or back.lstrip(" ") == text.lstrip(" ") or text.strip() == (unk_text or "").strip():
                return ids[0]
            raise TokenError(
                f"{where} {text!r} does not round-trip: it encodes to token {ids[0]}, which decodes to {back!r}; "
                f"{self._suggest(text)}; use the token's own string or give a token id"
            )
        pieces = [self.token_str(i) for i in ids]
        raise TokenError(
            f"{where} {text!r} is not a single token: it splits into {len(ids)} tokens {pieces!r} "
            f"(ids {ids}); use one of those tokens or give a token id"
        )

    def space_variant(self, text: str) -> tuple[int, int] | None:
        """``(id of text, id of " " + text)`` when ``text`` has no leading space, is one token whose
        string has no leading space either, and its space-prefixed form is another single token
        whose string starts with a space (``"Mary"`` and ``" Mary"`` in a BPE vocabulary); else
        None (a tokenizer that adds the space itself, a word with only one form, or one form the
        unknown token)."""
        if not text or text[0].isspace():
            return None
        try:
            ids, spaced = self.encode(text), self.encode(" " + text)
        except TokenError:
            return None
        if len(ids) != 1 or len(spaced) != 1 or ids[0] == spaced[0]:
            return None
        if self.unk_id in (ids[0], spaced[0]):  # one form is not in the vocabulary
            return None
        if self.token_str(ids[0])[:1].isspace() or not self.token_str(spaced[0])[:1].isspace():
            return None
        return ids[0], spaced[0]

    def space_warning(self, text: str, where: str = "token") -> str | None:
        """The warning for a target string without its leading space (:meth:`space_variant`), naming
        both tokens, or None."""
        found = self.space_variant(text)
        if found is None:
            return None
        plain, spaced = found
        return (f"{where} {text!r} is token {plain} {self.token_str(plain)!r}, without a leading space, and "
                f"{' ' + text!r} is token {spaced} {self.token_str(spaced)!r}: after a word the next token carries "
                f"the space, so write {' ' + text!r} unless the prompt ends where {text!r} follows")


def check_prompt_text(tokenizer: Tokenizer, text: str, *, strict: bool, where: str) -> None:
    """Warn (:class:`~circuitgraph.errors.UnknownTokenWarning`) about the pieces of a prompt text
    that ``tokenizer`` does not know, or raise :class:`~circuitgraph.errors.TokenError` if ``strict``."""
    pieces = tokenizer.unknown_pieces(text)
    if not pieces:
        return
    unk = tokenizer._unk_text()
    fate = f"became the unknown token {unk!r} or were dropped" if unk is not None else "were dropped"
    message = f"{where}: the tokenizer does not know {len(pieces)} piece(s) of the prompt {pieces!r}: they {fate}"
    if strict:
        raise TokenError(f"{message}; rephrase the prompt with known words, give token ids as "
                         "{tokens: [...]}, or drop strict: true to accept it with a warning")
    warnings.warn(f"{message} (prompt strict: true makes this an error)", UnknownTokenWarning, stacklevel=3)


class PromptFields(NamedTuple):
    """What a prompt says, whatever its shape (:func:`prompt_fields`): its ``text`` or its
    ``tokens`` (one of them; both None for something that is not a prompt), ``prepend_bos`` and
    ``strict`` (the text prompt's options, defaults True and False)."""

    text: str | None
    tokens: Any
    prepend_bos: bool
    strict: bool


def prompt_fields(prompt: Any) -> PromptFields:
    """The fields of a prompt given as a string, ``{"text": ..., "prepend_bos": ..., "strict": ...}``,
    ``{"tokens": [...]}``, the spec's ``TextPrompt`` / ``TokensPrompt`` or a sequence of token ids:
    the one reading of a prompt's shape (the run's :func:`circuitgraph.pipeline.inputs.resolve_prompt_like`,
    the checks' :func:`circuitgraph.validation._common.resolve_prompt`); each caller checks the values."""
    if isinstance(prompt, str):
        return PromptFields(prompt, None, True, False)
    if isinstance(prompt, dict):
        return PromptFields(prompt.get("text"), prompt.get("tokens"), prompt.get("prepend_bos", True),
                            bool(prompt.get("strict", False)))
    if hasattr(prompt, "tokens") or hasattr(prompt, "text"):
        return PromptFields(getattr(prompt, "text", None), getattr(prompt, "tokens", None),
                            getattr(prompt, "prepend_bos", True), bool(getattr(prompt, "strict", False)))
    return PromptFields(None, prompt if isinstance(prompt, (list, tuple)) else None, True, False)


def prompt_ids(tokenizer: Tokenizer, text: str, prepend_bos: bool = True) -> list[int]:
    """The token ids of a text prompt: ``tokenizer.encode(text)``, after the BOS token when
    ``prepend_bos`` and the tokenizer has one.  The one text-to-ids step of a prompt: the run
    (:func:`circuitgraph.pipeline.inputs.resolve_prompt_like`, which first refuses ``prepend_bos``
    without a BOS token), the checks' prompts (:func:`circuitgraph.validation._common.resolve_prompt`)
    and ``circuitgraph validate`` (:func:`circuitgraph.pipeline.preflight.tokens_of`)."""
    ids = [int(t) for t in tokenizer.encode(text)]
    bos_id = getattr(tokenizer, "bos_id", None)
    if prepend_bos and bos_id is not None:
        ids = [int(bos_id)] + ids
    return ids

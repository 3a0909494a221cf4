"""Tokenizers: a trivial byte-level one for the seeded model (ids 0..255 are
UTF-8 bytes), or a checkpoint's `tokenizer.json` when the `tokenizers`
package is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .config import BYTE_VOCAB


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < BYTE_VOCAB).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok
        self._tok = _Tok.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def load_tokenizer(checkpoint: str | None) -> Tokenizer:
    if checkpoint is not None:
        path = Path(checkpoint) / "tokenizer.json"
        if path.is_file():
            try:
                return HFTokenizer(path)
            except ImportError:
                pass
    return ByteTokenizer()

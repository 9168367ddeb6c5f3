"""A tokenizer's resolution remembered on disk, keyed by the bytes of its files and the library versions.

Why: a model tokenizer (``GPT2Tokenizer``, Llama's) is rebuilt by
transformers from its files, so resolving it needs ``import transformers``
(which imports torch) and two parses of its JSON: seconds per build, and
per task of a multi-task build, before a token is encoded. The result (the
normalised JSON and :class:`impl.encoding.TokenizerInfo`) is a pure function
of the tokenizer's files and the transformers/tokenizers versions, so it is
stored under a key of exactly those and read back without transformers: a
store's tokenizer identity, and so its fingerprint, is the same on a hit as
on a miss.

Where: ``$LOADSPEC_TOKENIZER_CACHE`` (``off`` disables it), else
``$XDG_CACHE_HOME/loadspec/tokenizers`` (``~/.cache/...``); an unwritable
directory only disables caching. An entry names its own JSON's sha256 and is
ignored unless it matches.

Worked example: ``loadspec build data/ out/ --tokenizer gpt2/`` resolves
``gpt2/`` through transformers once; the next build (or task) that names
the same unchanged files reads ``<cache>/<key>.json`` instead, and a changed
``tokenizer_config.json`` gives a new key.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from impl._atomic import atomic_write_json

__all__ = ["cache_key", "load_cached", "store_cached"]

_FORMAT = "loadspec.tokenizer_resolution"
_VERSION = 1
_CONTENT_LIMIT = 64 << 20   # larger files (model weights beside the tokenizer) are keyed by size and mtime


def _cache_dir() -> Path | None:
    env = os.environ.get("LOADSPEC_TOKENIZER_CACHE")
    if env is not None:
        return None if env.lower() in ("", "0", "off", "false", "no") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "loadspec" / "tokenizers"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cache_key(spec: Any) -> str | None:
    """The key of a tokenizer path (its folder's files by content, the spec's kind, the library versions), or None."""
    if not isinstance(spec, (str, os.PathLike)):
        return None
    path = Path(os.path.abspath(os.fspath(spec)))
    folder = path if path.is_dir() else path.parent
    if not path.exists() or not folder.is_dir():
        return None
    digest = hashlib.sha256(json.dumps({
        "format": _FORMAT, "version": _VERSION, "spec": "dir" if path.is_dir() else path.name,
        "transformers": _version("transformers"), "tokenizers": _version("tokenizers"),
    }, sort_keys=True).encode())
    try:
        for entry in sorted(folder.iterdir()):
            if not entry.is_file():
                continue
            st = entry.stat()
            digest.update(entry.name.encode() + b"\0" + str(st.st_size).encode() + b"\0")
            if st.st_size <= _CONTENT_LIMIT:
                digest.update(hashlib.sha256(entry.read_bytes()).digest())
            else:
                digest.update(str(st.st_mtime_ns).encode())
    except OSError:
        return None
    return digest.hexdigest()


def load_cached(key: str) -> tuple[str, dict[str, Any]] | None:
    """``(tokenizer JSON, info fields)`` stored under ``key``, or None (absent, unreadable, or not self-consistent)."""
    where = _cache_dir()
    if where is None:
        return None
    try:
        entry = json.loads((where / f"{key}.json").read_text(encoding="utf-8"))
        tok_json, info = entry["tok_json"], entry["info"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (entry.get("format") != _FORMAT or entry.get("version") != _VERSION or not isinstance(tok_json, str)
            or not isinstance(info, dict)
            or hashlib.sha256(tok_json.encode("utf-8")).hexdigest() != info.get("sha256")):
        return None
    return tok_json, info


def store_cached(key: str, tok_json: str, info: dict[str, Any]) -> None:
    """Remember a resolution (best effort: an unwritable cache directory is skipped)."""
    where = _cache_dir()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        atomic_write_json(where / f"{key}.json", {"format": _FORMAT, "version": _VERSION, "tok_json": tok_json,
                                                  "info": info}, indent=None)
    except OSError:
        return

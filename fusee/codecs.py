"""Payload codecs: what turns a payload's bytes into the bytes a journal keeps.

A payload (a run's input, a step's result or error, a signal, an update, an
event, a stream chunk, a completion, a run's result) becomes bytes through
fusee's converter, then through the engine's codec chain
(``Engine.open(..., codecs=[...])``), in list order; a reader undoes them in
the opposite order. The ids of the codecs a payload went through are kept
with it, so a process reads it as long as it has those codecs, whatever its
own chain is (key rotation: a new key encrypts, the old keys still decrypt).
The journal's own structure (positions, names, kinds) is never encoded:
``fusee show`` reads it without any key.

Two codecs are built in: `Zstd` (the ``zstd`` extra) and `Encrypt`
(AES-GCM, the ``encrypt`` extra).

Example:
    >>> chain = [Zstd(level=3)]
    >>> chain[0].decode(chain[0].encode(b"x" * 1000)) == b"x" * 1000
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Protocol, runtime_checkable

from fusee.errors import PayloadError

__all__ = ["Encrypt", "PayloadCodec", "Zstd"]


@runtime_checkable
class PayloadCodec(Protocol):
    """Turns a payload's bytes into other bytes and back (compression, encryption).

    ``id`` names the codec in every payload it encoded: keep it stable for
    as long as such payloads are kept. ``decode`` raises
    `fusee.PayloadError` for bytes it cannot decode (never returns wrong
    bytes); the engine adds the run, the position and the codec's id.

    Example:
        >>> import base64
        >>> class Base64:
        ...     id = "base64"
        ...     def encode(self, data: bytes) -> bytes:
        ...         return base64.b64encode(data)
        ...     def decode(self, data: bytes) -> bytes:
        ...         return base64.b64decode(data)
        >>> isinstance(Base64(), PayloadCodec)
        True
    """

    @property
    def id(self) -> str:
        """A short, stable name, kept with every payload this codec encoded."""
        ...

    def encode(self, data: bytes) -> bytes:
        """Returns ``data`` encoded."""
        ...

    def decode(self, data: bytes) -> bytes:
        """Returns what `encode` was given; raises `fusee.PayloadError` on bad bytes."""
        ...


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"this codec needs the '{module}' package: pip install 'fusee[{extra}]'"
        ) from None


class Zstd:
    """Zstandard compression (the ``zstd`` extra: the ``zstandard`` package).

    Args:
        level: The compression level, 1 (fastest) to 22 (smallest); 3 by default.

    Example:
        >>> z = Zstd(level=3)
        >>> data = b"customer " * 100
        >>> len(z.encode(data)) < len(data), z.decode(z.encode(data)) == data
        (True, True)
    """

    id: Final = "zstd"

    def __init__(self, level: int = 3) -> None:
        if type(level) is not int or not 1 <= level <= 22:
            raise ValueError(f"Zstd(level=) takes an int from 1 to 22, not {level!r}")
        zstandard = _need("zstandard", "zstd")
        self.level = level
        self._compress = zstandard.ZstdCompressor(level=level).compress
        self._decompressor = zstandard.ZstdDecompressor()
        self._error: type[Exception] = zstandard.ZstdError

    def __repr__(self) -> str:
        return f"Zstd(level={self.level})"

    def encode(self, data: bytes) -> bytes:
        """Returns ``data`` compressed (a zstd frame that records its size)."""
        return bytes(self._compress(data))

    def decode(self, data: bytes) -> bytes:
        """Returns ``data`` decompressed; raises `fusee.PayloadError` on a damaged frame."""
        try:
            return bytes(self._decompressor.decompress(data))
        except self._error as e:
            raise PayloadError(f"the zstd frame does not decompress ({e})") from None


_ENCRYPT_VERSION: Final = 1
_NONCE: Final = 12
_KEY_SIZES: Final = (16, 24, 32)


class Encrypt:
    """AES-GCM encryption with named keys (the ``encrypt`` extra: ``cryptography``).

    Payloads are encrypted with the ``active`` key; each keeps its key's id,
    so a payload encrypted with any key of ``keys`` decrypts. To rotate,
    add a new key and make it active: new payloads use it, old ones still
    decrypt while their key stays in ``keys``. A payload whose key is not
    there, or whose bytes were altered (GCM authenticates them), raises
    `fusee.PayloadError`; it never decrypts to wrong bytes.

    Args:
        keys: Key id -> key (16, 24 or 32 bytes: AES-128, -192 or -256).
        active: The id of the key new payloads are encrypted with.

    Example:
        >>> e = Encrypt(keys={"k1": bytes(32)}, active="k1")
        >>> e.decode(e.encode(b"card 4242")) == b"card 4242"
        True
        >>> e.encode(b"x") != e.encode(b"x")  # a fresh nonce each time
        True
    """

    id: Final = "aes-gcm"

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        aead = _need("cryptography.hazmat.primitives.ciphers.aead", "encrypt")
        if not isinstance(keys, Mapping) or not keys:
            raise ValueError("Encrypt(keys=) needs a mapping of key id -> key bytes")
        self._keys: dict[str, Any] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not key_id or len(key_id.encode()) > 255:
                raise ValueError(f"a key id is non-empty text of at most 255 bytes: {key_id!r}")
            if type(key) is not bytes or len(key) not in _KEY_SIZES:
                raise ValueError(
                    f"key {key_id!r} must be 16, 24 or 32 bytes (AES-128/192/256); "
                    "make one with os.urandom(32)"
                )
            self._keys[key_id] = aead.AESGCM(key)
        if active not in self._keys:
            raise ValueError(f"Encrypt(active={active!r}) is not one of the keys {sorted(keys)}")
        self.active = active
        self._active_key = self._keys[active]
        self._header = bytes([_ENCRYPT_VERSION, len(active.encode())]) + active.encode()
        self._invalid: type[Exception] = _need("cryptography.exceptions", "encrypt").InvalidTag

    def __repr__(self) -> str:
        # The keys never show: their ids only.
        return f"Encrypt(keys=[{', '.join(map(repr, self._keys))}], active={self.active!r})"

    def encode(self, data: bytes) -> bytes:
        """Returns ``data`` encrypted with the active key (its id and nonce in front)."""
        nonce = os.urandom(_NONCE)
        header = self._header
        sealed: bytes = self._active_key.encrypt(nonce, data, header)
        return header + nonce + sealed

    def decode(self, data: bytes) -> bytes:
        """Returns ``data`` decrypted; raises `fusee.PayloadError` for a missing key or damage."""
        if len(data) < 2 or data[0] != _ENCRYPT_VERSION:
            raise PayloadError("the bytes are not an AES-GCM payload of this version")
        end = 2 + data[1]
        header = data[:end]
        key_id = header[2:].decode("utf-8", "replace")
        key = self._keys.get(key_id)
        if key is None:
            raise PayloadError(
                f"encrypted with key {key_id}; this process has "
                f"{', '.join(self._keys)}: add key {key_id!r} to Encrypt(keys=...)"
            )
        nonce = data[end : end + _NONCE]
        try:
            plain: bytes = key.decrypt(nonce, data[end + _NONCE :], header)
        except self._invalid:
            raise PayloadError(
                f"the ciphertext (key {key_id}) does not authenticate: it was altered"
            ) from None
        return plain

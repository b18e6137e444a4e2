"""The codecs the CLI's and the UI's payload tests name as ``payload_keys:CODECS``.

A fixed test key: these tests check that readers decode with the workers'
chain, not the secrecy of the key.
"""

from __future__ import annotations

from fusee.codecs import Encrypt, PayloadCodec, Zstd

KEY = bytes(range(32))

CODECS: list[PayloadCodec] = [Zstd(), Encrypt(keys={"k1": KEY}, active="k1")]

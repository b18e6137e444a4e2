"""The payload codecs (`fusee.codecs`) and the chain's envelope (`fusee._payloads`)."""

from __future__ import annotations

import os

import pytest

import fusee
from fusee._payloads import Payloads, load_codecs, parse_size
from fusee.codecs import Encrypt, PayloadCodec, Zstd

K1, K2 = os.urandom(32), os.urandom(16)

PAYLOADS = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x01", id="one-byte"),
    pytest.param(b"order " * 2000, id="compressible"),
    pytest.param(os.urandom(5000), id="random"),
]


@pytest.mark.parametrize("data", PAYLOADS)
@pytest.mark.parametrize(
    "codec",
    [
        pytest.param(Zstd(), id="zstd"),
        pytest.param(Zstd(level=19), id="zstd-19"),
        pytest.param(Encrypt(keys={"k1": K1}, active="k1"), id="aes-256"),
        pytest.param(Encrypt(keys={"k2": K2}, active="k2"), id="aes-128"),
    ],
)
def test_each_codec_decodes_what_it_encoded(codec: PayloadCodec, data: bytes) -> None:
    assert isinstance(codec, PayloadCodec)
    assert codec.decode(codec.encode(data)) == data


def test_zstd_makes_a_repetitive_payload_smaller() -> None:
    data = b'{"sku": "A1", "qty": 1}' * 500
    assert len(Zstd().encode(data)) < len(data) // 10


def test_encrypt_hides_the_plaintext_and_never_repeats_a_ciphertext() -> None:
    e = Encrypt(keys={"k1": K1}, active="k1")
    one, two = e.encode(b"card 4242"), e.encode(b"card 4242")
    assert b"card" not in one
    assert one != two


def test_a_payload_encrypted_with_an_old_key_decrypts_while_the_new_key_encrypts() -> None:
    old = Encrypt(keys={"k1": K1}, active="k1")
    rotated = Encrypt(keys={"k1": K1, "k2": K2}, active="k2")
    written_before = old.encode(b"before")
    assert rotated.decode(written_before) == b"before"
    with pytest.raises(fusee.PayloadError, match="encrypted with key k2; this process has k1"):
        old.decode(rotated.encode(b"after"))


@pytest.mark.parametrize(
    "at",
    [
        pytest.param(3, id="key-id"),
        pytest.param(20, id="nonce"),
        pytest.param(-1, id="tag"),
        pytest.param(40, id="body"),
    ],
)
def test_a_tampered_ciphertext_is_refused_never_decrypted(at: int) -> None:
    e = Encrypt(keys={"k1": K1}, active="k1")
    sealed = bytearray(e.encode(b"x" * 64))
    sealed[at] ^= 0x40
    with pytest.raises(fusee.PayloadError):
        e.decode(bytes(sealed))


def test_a_damaged_zstd_frame_is_a_payload_error() -> None:
    frame = bytearray(Zstd().encode(b"order " * 100))
    frame[len(frame) // 2] ^= 0xFF
    with pytest.raises(fusee.PayloadError, match="zstd frame"):
        Zstd().decode(bytes(frame[:-4]))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: Encrypt(keys={}, active="k"), "mapping", id="no-keys"),
        pytest.param(lambda: Encrypt(keys={"k": b"short"}, active="k"), "16, 24 or 32", id="size"),
        pytest.param(lambda: Encrypt(keys={"k": K1}, active="j"), "not one of", id="active"),
        pytest.param(lambda: Zstd(level=0), "1 to 22", id="level"),
        pytest.param(lambda: Payloads([Zstd(), Zstd()]), "two codecs with id", id="twice"),
        pytest.param(lambda: Payloads([], max_payload="lots"), "max_payload takes", id="size-text"),
    ],
)
def test_bad_codec_arguments_are_refused_saying_what_to_pass(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


def test_an_encrypt_codec_never_shows_its_keys() -> None:
    e = Encrypt(keys={"k1": K1}, active="k1")
    assert repr(e) == "Encrypt(keys=['k1'], active='k1')"
    assert K1.hex() not in repr(e)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4MiB", 4 * 1024 * 1024), ("256KiB", 256 * 1024), ("1.5 MB", 1_500_000), (7, 7), ("0", 0)],
)
def test_sizes_read_as_bytes(text: object, size: int) -> None:
    assert parse_size(text, "x") == size


def test_codecs_load_from_module_attr_as_the_cli_and_ui_take_them() -> None:
    (z,) = load_codecs("fusee.codecs:Zstd")
    assert isinstance(z, Zstd)
    with pytest.raises(ValueError, match="module:attr"):
        load_codecs("fusee.codecs")


def test_a_codec_class_given_for_an_instance_is_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"Zstd\(...\), not the class"):
        Payloads([Zstd])  # type: ignore[list-item]

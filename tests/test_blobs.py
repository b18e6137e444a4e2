"""Blob stores (`fusee.blobs`): a directory, and S3 against moto's server on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee._payloads import delete_run_blobs, run_blobs
from fusee.blobs import S3, BlobStore, Directory
from fusee.codecs import Encrypt, Zstd
from fusee.testing import TestEngine

CARD = "card-4242-4242-4242-4242"
NOISE = os.urandom(600).hex()  # does not compress below offload_over


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server, on a free loopback port, for this module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, request: pytest.FixtureRequest) -> S3:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    bucket = f"fusee-{request.node.name.lower().replace('_', '-')[:40].strip('-')}"
    client.create_bucket(Bucket=bucket)
    return S3(bucket, prefix="runs/", client=client)


@pytest.fixture(params=["directory", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "directory":
        return Directory(tmp_path / "blobs")
    store: S3 = request.getfixturevalue("s3")
    return store


def test_a_blob_put_is_read_back_replaced_and_deleted(blobs: BlobStore) -> None:
    assert isinstance(blobs, BlobStore)
    data = os.urandom(300_000)
    blobs.put("ab/1/7-0", data)
    assert blobs.get("ab/1/7-0") == data
    blobs.put("ab/1/7-0", b"again")
    assert blobs.get("ab/1/7-0") == b"again"
    blobs.delete("ab/1/7-0")
    assert blobs.get("ab/1/7-0") is None
    blobs.delete("ab/1/7-0")  # a missing blob deletes quietly
    for key in ("ab/1/7-0", "ab/2/9-1", "abc/1/3-0"):
        blobs.put(key, b"x")
    blobs.delete_prefix("ab/")
    assert [blobs.get(k) for k in ("ab/1/7-0", "ab/2/9-1", "abc/1/3-0")] == [None, None, b"x"]
    blobs.delete_prefix("nothing/")  # no blob under it: nothing to do


def test_a_directory_refuses_keys_that_leave_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a blob key"):
        Directory(tmp_path).put("../escape", b"x")


def test_an_s3_store_keeps_its_blobs_under_its_prefix(s3: S3) -> None:
    s3.put("k/1/2-0", b"x")
    listed = s3._client.list_objects_v2(Bucket=s3.bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["runs/k/1/2-0"]


@fusee.workflow("ship-blob")
async def ship(ctx: fusee.Ctx, parcel: str) -> str:
    label = await ctx.step("label", lambda: f"label {parcel} {NOISE}")
    return f"shipped {label}"


async def test_a_run_offloaded_to_each_blob_store_reads_back_after_a_crash_and_its_blobs_delete(
    blobs: BlobStore,
) -> None:
    codecs = [Zstd(), Encrypt(keys={"k1": os.urandom(32)}, active="k1")]
    options: dict[str, Any] = {"codecs": codecs, "blobs": blobs, "offload_over": "100"}
    async with TestEngine([ship], **options) as t:
        run = await t.start(ship, "b-1", CARD)
        expected = f"shipped label {CARD} {NOISE}"
        assert await run.result() == expected
        refs = await run_blobs(t.store, "b-1")
        assert len(refs) == 2  # the step's result, the run's result (the input is small)
        assert all(CARD.encode() not in (blobs.get(r.key) or b"") for r in refs)
        await t.crash()
        assert await run.result() == expected
        other = await t.start(ship, "b-2", CARD)
        assert await other.result() == expected
        kept = await run_blobs(t.store, "b-2")
        # Deleting a run deletes its blobs, and only its own.
        await run.delete()
        assert [blobs.get(r.key) for r in refs] == [None, None]
        assert all(blobs.get(r.key) is not None for r in kept)
        assert await delete_run_blobs(t.store, "b-2") == 2
        assert [blobs.get(r.key) for r in kept] == [None, None]

"""`fusee.Client` and `fusee.SyncClient` with the workers' payload codecs and blob store."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import client_workflows as wfs
import pytest
from payload_keys import CODECS

import fusee
from fusee._payloads import raw_load

WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [wfs.tally, wfs.echo]
SECRET = "card-4242-4242-4242-4242"

pytestmark = pytest.mark.asyncio


async def test_a_client_with_the_workers_codecs_reads_results_streams_and_answers(
    tmp_path: Path,
) -> None:
    async with (
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, durability="none", codecs=CODECS),
        await fusee.Client.connect(tmp_path, durability="none", codecs=CODECS) as client,
    ):
        run = await client.start(wfs.echo, "e-1", SECRET)
        assert await run.result() == SECRET
        tally = await client.start(wfs.tally, "t-1", 1)
        assert await tally.update(wfs.bump, 2) == 3
        await tally.signal(wfs.add, 0)
        assert await tally.result() == 3
        assert [x async for x in tally.stream("log")] == ["total 3"]
        assert not any(SECRET.encode() in d for _, d in await raw_load(client.store, "e-1"))


async def test_a_client_without_them_gets_a_payload_error_naming_the_codec(tmp_path: Path) -> None:
    async with await fusee.Engine.open(
        tmp_path, workflows=WORKFLOWS, durability="none", codecs=CODECS
    ) as engine:
        await engine.execute(wfs.echo, "e-1", SECRET)
    async with await fusee.Client.connect(tmp_path, durability="none") as client:
        with pytest.raises(fusee.PayloadError, match="codec 'aes-gcm', which this process"):
            await client.get("e-1").result()


async def test_a_sync_client_reads_an_offloaded_result_from_the_default_blob_directory(
    tmp_path: Path,
) -> None:
    big = os.urandom(400_000).hex()  # over offload_over after compression
    async with await fusee.Engine.open(
        tmp_path, workflows=WORKFLOWS, durability="none", codecs=CODECS
    ):

        def script() -> str:
            with fusee.SyncClient.connect(tmp_path, durability="none", codecs=CODECS) as sync:
                result: str = sync.start(wfs.echo, "e-big", big).result()
                return result

        assert await asyncio.to_thread(script) == big
    blobs = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 3  # the input, the step's result, the run's result


async def test_a_signal_over_max_payload_from_a_client_is_refused_by_the_worker(
    tmp_path: Path,
) -> None:
    async with (
        await fusee.Engine.open(
            tmp_path, workflows=WORKFLOWS, durability="none", max_payload="1KiB"
        ),
        await fusee.Client.connect(tmp_path, durability="none") as client,
    ):
        run = await client.start(wfs.echo, "e-2", "x")
        assert await run.result() == "x"
        with pytest.raises(fusee.PayloadTooLarge, match="over the limit of 1,024 bytes"):
            await client.start(wfs.echo, "e-3", "y" * 2000)

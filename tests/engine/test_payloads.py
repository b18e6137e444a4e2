"""Payloads through the codec chain and offload (`fusee._payloads`), and their limits.

Every payload kind (input, step result and error, signal, update, event,
stream chunk, completion, child input and result, the run's result) goes
through Zstd + Encrypt and, offloaded, through a blob directory, on the
memory store, SQLite and Postgres, live and after crashes. The store keeps
no plaintext; a reader without the key gets a `fusee.PayloadError` that
names the run, the position and the codec.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee import _codec
from fusee._payloads import raw_load, run_blobs
from fusee.blobs import Directory
from fusee.codecs import Encrypt, Zstd
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Host, assert_steps_ran_once, eventually

pytestmark = pytest.mark.asyncio

CARD = "card-4242-4242-4242-4242"
K1, K2 = os.urandom(32), os.urandom(32)

note = fusee.signal("note", str)
amend = fusee.update("amend", str)


def chain(active: str = "k1", **keys: bytes) -> list[fusee.PayloadCodec]:
    return [Zstd(level=3), Encrypt(keys=keys or {"k1": K1}, active=active)]


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, parcel: str) -> str:
    return f"shipped {parcel}"


def _decline() -> None:
    raise fusee.Failure(f"declined {CARD}")


@fusee.workflow("vault")
async def vault(ctx: fusee.Ctx, order: dict[str, str]) -> dict[str, Any]:
    amended: list[str] = []

    def on_amend(text: str) -> str:
        amended.append(text)
        return f"amended {text}"

    ctx.on_update(amend, on_amend)
    charged = await ctx.step("charge", lambda: {"card": order["card"], "ok": True})
    try:
        await ctx.step("decline", _decline)
        declined = ""
    except fusee.StepFailed as e:
        declined = str(e)
    async with ctx.stream("log") as log:
        await log.append(f"log {order['card']}")
    await ctx.set_event("seen", order["card"])
    said = await ctx.wait_for(note)
    approved = await ctx.await_completion("approve", lambda s: None, result_type=str)
    shipped = await ctx.child(ship, f"{ctx.info.id}-ship", order["card"])
    return {
        "charged": charged,
        "declined": CARD in declined,
        "note": said,
        "approved": approved,
        "shipped": shipped,
        "amended": amended,
    }


EXPECTED = {
    "charged": {"card": CARD, "ok": True},
    "declined": True,
    "note": f"note {CARD}",
    "approved": f"yes {CARD}",
    "shipped": f"shipped {CARD}",
    "amended": [f"for {CARD}"],
}


async def _drive(t: TestEngine, run: fusee.Run[Any]) -> None:
    await run.signal(note, f"note {CARD}", dedup="n-1")
    await t.settle()
    if (await run.describe()).status in ("running", "suspended"):
        assert await run.update(amend, f"for {CARD}", id="u-1") == f"amended for {CARD}"
    token = await _token(t, run.id)
    if token is not None:
        await t.complete(token, f"yes {CARD}")


async def _token(t: TestEngine, id: str) -> str | None:
    from fusee.record import Awaiting, Completed, decode

    records = [decode(d) for _, d in await t.store.load(id)]
    done = {r.seq for r in records if isinstance(r, Completed)}
    for r in records:
        if isinstance(r, Awaiting) and r.seq not in done:
            return f"{id}/{r.run}/{r.seq}/{r.attempt}"
    return None


async def _plaintext_in(t: TestEngine, *ids: str) -> list[str]:
    found = []
    for id in ids:
        for lsn, data in await raw_load(t.store, id):
            if CARD.encode() in data:
                found.append(f"{id}@{lsn}")
    return found


async def test_every_payload_kind_round_trips_encrypted_and_the_store_keeps_no_plaintext(
    host: Host,
) -> None:
    async with host(workflows=[vault, ship], codecs=chain()) as t:
        run = await t.start(vault, "v-1", {"card": CARD})
        await _drive(t, run)
        assert await run.result() == EXPECTED
        assert [x async for x in run.stream("log")] == [f"log {CARD}"]
        assert await run.get_event("seen") == CARD
        assert await _plaintext_in(t, "v-1", "v-1-ship") == []
        await t.crash()
        # Read back from the store, decrypted, after the crash.
        assert await run.result() == EXPECTED
        assert await run.get_event("seen") == CARD
        assert_steps_ran_once(t)


@dataclasses.dataclass
class Receipt:
    id: uuid.UUID
    at: datetime.datetime
    total: decimal.Decimal
    card: str


RECEIPT = Receipt(
    uuid.UUID(int=7), datetime.datetime(2026, 12, 3, 16, 0), decimal.Decimal("9.90"), CARD
)


@fusee.workflow("receipt")
async def receipt(ctx: fusee.Ctx, receipt: Receipt) -> Receipt:
    return await ctx.step("copy", lambda: dataclasses.replace(receipt), result_type=Receipt)


async def test_a_value_in_the_converters_typed_form_is_encrypted_like_any_other(
    host: Host,
) -> None:
    # The typed form starts with a byte an envelope starts with too: the
    # chain must still encode it, and read it back as the value it was.
    assert _codec.encode(RECEIPT)[:1] == b"\xc1"
    async with host(workflows=[receipt], codecs=chain()) as t:
        run = await t.start(receipt, "r-1", RECEIPT)
        assert await run.result() == RECEIPT
        assert await _plaintext_in(t, "r-1") == []
        await t.crash()
        assert await run.result() == RECEIPT


async def test_every_payload_kind_offloaded_to_blobs_round_trips_and_the_journal_keeps_refs(
    host: Host, tmp_path: Path
) -> None:
    blobs = Directory(tmp_path / "blobs")
    async with host(workflows=[vault, ship], codecs=chain(), blobs=blobs, offload_over=0) as t:
        run = await t.start(vault, "v-2", {"card": CARD})
        await _drive(t, run)
        assert await run.result() == EXPECTED
        refs = await run_blobs(t.store, "v-2")
        assert len(refs) >= 10  # one per payload: none stayed in the journal
        on_disk = [p.read_bytes() for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
        assert len(on_disk) >= len(refs)
        assert not any(CARD.encode() in b for b in on_disk)  # codecs before offload
        await t.crash()
        assert await run.result() == EXPECTED
        assert [x async for x in run.stream("log")] == [f"log {CARD}"]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"codecs": "chain"}, id="zstd+encrypt"),
        pytest.param({"codecs": "chain", "offload_over": 0}, id="offloaded"),
    ],
)
async def test_every_payload_kind_survives_a_crash_at_every_record(
    options: dict[str, Any], tmp_path: Path
) -> None:
    engine_options: dict[str, Any] = {"codecs": chain()}
    if "offload_over" in options:
        engine_options.update(blobs=Directory(tmp_path / "blobs"), offload_over=0)
    result = await crash_everywhere(
        vault,
        {"card": CARD},
        workflows=[ship],
        id="v-crash",
        drive=_drive,
        engine_options=engine_options,
    )
    assert result == EXPECTED


async def test_a_new_key_encrypts_and_the_old_key_still_decrypts(host: Host) -> None:
    store = None
    async with host(workflows=[vault, ship], codecs=chain("k1", k1=K1)) as t:
        run = await t.start(vault, "v-rot", {"card": CARD})
        await t.settle()
        store = t.store
    async with host(workflows=[vault, ship], store=store, codecs=chain("k2", k1=K1, k2=K2)) as t2:
        run = t2.get("v-rot")
        await _drive(t2, run)
        assert await run.result() == EXPECTED
    # A process with the new key only reads what was written after rotation, and
    # says which key the rest needs.
    async with host(workflows=[], store=store, codecs=chain("k2", k2=K2)) as t3:
        with pytest.raises(fusee.PayloadError) as e:
            await t3.get("v-rot").result()
        assert "encrypted with key k1; this process has k2" in str(e.value)
        assert "run 'v-rot'" in str(e.value)
        assert "position" in str(e.value)
        assert "codec 'aes-gcm'" in str(e.value)


async def test_without_codecs_the_journal_keeps_todays_bytes_and_a_chain_added_later_reads_them(
    host: Host,
) -> None:
    from fusee import _codec
    from fusee.record import Start, decode

    async with host(workflows=[vault, ship]) as t:
        run = await t.start(vault, "v-old", {"card": CARD})
        await t.settle()
        store = t.store
        (_, first), *_ = await raw_load(store, "v-old")
        start = decode(first)
        assert isinstance(start, Start)
        assert start.input == _codec.encode({"card": CARD})  # no envelope: as before
    async with host(workflows=[vault, ship], store=store, codecs=chain()) as t2:
        run = t2.get("v-old")
        await _drive(t2, run)
        assert await run.result() == EXPECTED
        assert_steps_ran_once(t2)


async def test_a_reader_without_the_codec_gets_a_payload_error_never_a_wrong_value(
    host: Host,
) -> None:
    async with host(workflows=[ship], codecs=chain()) as t:
        assert await t.execute(ship, "s-1", CARD) == f"shipped {CARD}"
        store = t.store
    async with host(workflows=[ship], store=store, codecs=[Zstd()]) as t2:
        with pytest.raises(fusee.PayloadError, match="codec 'aes-gcm', which this process"):
            await t2.get("s-1").result()


async def test_a_tampered_ciphertext_is_a_payload_error(host: Host) -> None:
    import dataclasses

    from fusee.record import Done, decode, encode

    async with host(workflows=[ship], codecs=chain()) as t:
        await t.execute(ship, "s-2", CARD)
        # A copy of its journal under another id, one byte of its result's ciphertext flipped.
        committer = t.engine.committer
        row = await t.store.get("s-2")
        assert row is not None
        committer.put_row(dataclasses.replace(row, id="s-3"))
        for _, data in await raw_load(t.store, "s-2"):
            rec = decode(data)
            if isinstance(rec, Done):
                bad = bytearray(rec.payload)
                bad[-3] ^= 0x01
                data = encode(dataclasses.replace(rec, payload=bytes(bad)))
            lsn = committer.append("s-3", 1, data)  # already sealed: stored as is
        await committer.durable(lsn)
        await t.crash()
        with pytest.raises(fusee.PayloadError, match="does not authenticate: it was altered"):
            await t.get("s-3").result()
        assert await t.get("s-2").result() == f"shipped {CARD}"


async def test_a_missing_blob_is_a_payload_error_naming_it(host: Host, tmp_path: Path) -> None:
    blobs = Directory(tmp_path / "blobs")
    async with host(workflows=[ship], blobs=blobs, offload_over=0) as t:
        await t.execute(ship, "s-4", CARD)
        (ref, *_) = await run_blobs(t.store, "s-4")
        blobs.delete(ref.key)
        await t.crash()
        with pytest.raises(fusee.PayloadError, match=rf"its blob {ref.key} is missing"):
            await t.get("s-4").result()


async def test_an_altered_blob_is_a_payload_error(host: Host, tmp_path: Path) -> None:
    blobs = Directory(tmp_path / "blobs")
    async with host(workflows=[ship], blobs=blobs, offload_over=0) as t:
        await t.execute(ship, "s-5", CARD)
        refs = await run_blobs(t.store, "s-5")
        blobs.put(refs[-1].key, b"\x00" + (blobs.get(refs[-1].key) or b""))
        await t.crash()
        with pytest.raises(fusee.PayloadError, match="was altered"):
            await t.get("s-5").result()


async def test_a_blob_write_that_fails_stores_no_record_and_the_engine_writes_it_again(
    host: Host, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A regular file where the blob directory should be: every blob write fails.
    (tmp_path / "blocked").write_bytes(b"")
    blobs = Directory(tmp_path / "blocked" / "blobs")
    async with host(workflows=[ship], blobs=blobs, offload_over=0) as t:
        with caplog.at_level(logging.WARNING, logger="fusee"):
            start = asyncio.ensure_future(t.start(ship, "s-6", CARD))
            await eventually(lambda: t.engine.committer.retrying, "the write's retry")
            assert not start.done()  # not acknowledged
            assert await t.store.get("s-6") is None  # nothing of the batch was stored
            (tmp_path / "blocked").unlink()
            await t.advance("1s")
            run = await start
            assert await run.result() == f"shipped {CARD}"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("writing a blob to Directory" in m for m in warnings), warnings
        await t.crash()
        assert await t.get("s-6").result() == f"shipped {CARD}"


# --- limits -----------------------------------------------------------------------------------


big = fusee.signal("big", str)


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, size: int) -> str:
    ctx.on_update(amend, lambda s: len(s))
    got = await ctx.wait_for(big)
    step = await ctx.step("grow", lambda: "x" * size)
    return f"{len(got or '')} {len(step)}"


async def test_a_payload_over_max_payload_is_refused_at_every_door_and_nothing_is_recorded(
    host: Host,
) -> None:
    async with host(workflows=[echo, ship], max_payload="1KiB") as t:
        with pytest.raises(fusee.PayloadTooLarge, match="the input of run 'e-0'"):
            await t.start(ship, "e-0", "x" * 2000)
        assert await t.store.get("e-0") is None
        run = await t.start(echo, "e-1", 10)
        with pytest.raises(fusee.PayloadTooLarge, match="signal 'big'") as e:
            await run.signal(big, "y" * 2000)
        assert e.value.limit == 1024
        assert e.value.size > 2000
        with pytest.raises(fusee.PayloadTooLarge, match="update 'amend'"):
            await run.update(amend, "y" * 2000)
        with pytest.raises(fusee.PayloadTooLarge, match="completion"):
            await t.complete("e-1/1/9/1", "y" * 2000)
        await run.signal(big, "small")
        assert await run.result() == "5 10"


async def test_a_step_result_over_max_payload_fails_the_step_and_never_reaches_the_journal(
    host: Host,
) -> None:
    async with host(workflows=[echo], max_payload="1KiB") as t:
        run = await t.start(echo, "e-2", 5000)
        await run.signal(big, "s")
        with pytest.raises(fusee.WorkflowFailed, match="PayloadTooLarge"):
            await run.result()
        assert not any(b"x" * 1025 in d for _, d in await t.store.load("e-2"))
        await t.crash()
        with pytest.raises(fusee.WorkflowFailed, match="over the limit of 1,024 bytes"):
            await run.result()


@fusee.workflow("chatty")
async def chatty(ctx: fusee.Ctx, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", lambda i=i: i)
    return n


async def test_a_run_past_warn_records_logs_one_warning_suggesting_continue_as_new(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(workflows=[chatty], warn_records=5) as t:
        with caplog.at_level(logging.WARNING, logger="fusee.payloads"):
            assert await t.execute(chatty, "c-1", 8) == 8
            assert await t.execute(chatty, "c-2", 3) == 3
        warned = [r.getMessage() for r in caplog.records if r.name == "fusee.payloads"]
        assert len(warned) == 1
        assert "run 'c-1' (run 1)" in warned[0]
        assert "continue as new" in warned[0]

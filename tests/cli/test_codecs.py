"""The ``fusee`` command over encrypted payloads: ``--codecs MODULE:ATTR``, and without it."""

from __future__ import annotations

import json
from pathlib import Path

import cli_workflows as wfs
import pytest
from payload_keys import CODECS

from .conftest import MODULE, acli, cli, engine_on, one_line_error, worker

KEYS = "payload_keys:CODECS"


async def _encrypted_store(data: Path) -> None:
    async with engine_on(data, codecs=CODECS) as engine:
        assert await engine.execute(wfs.greet, "g-1", "ada") == "hello ada"


@pytest.mark.asyncio
async def test_show_and_result_decode_payloads_with_the_workers_codecs(tmp_path: Path) -> None:
    await _encrypted_store(tmp_path)
    code, out, _ = await acli("show", "g-1", "--data", str(tmp_path), "--json", "--codecs", KEYS)
    assert code == 0
    records = json.loads(out)["records"]
    assert records[0]["payload"] == "ada"
    assert records[-1]["payload"] == "hello ada"
    code, out, _ = await acli("result", "g-1", "--data", str(tmp_path), "--codecs", KEYS)
    assert (code, out.strip()) == (0, '"hello ada"')


@pytest.mark.asyncio
async def test_without_codecs_show_prints_the_journal_and_says_what_each_payload_needs(
    tmp_path: Path,
) -> None:
    await _encrypted_store(tmp_path)
    code, out, _ = await acli("show", "g-1", "--data", str(tmp_path), "--json")
    assert code == 0
    records = json.loads(out)["records"]
    assert records[0]["kind"] == "start"
    assert "codec 'aes-gcm', which this process does not have" in records[0]["payload"]
    assert "--codecs MODULE:ATTR" in records[0]["payload"]
    # Search attributes are not payloads (the store indexes them): the rest stays hidden.
    assert "hello ada" not in out
    assert records[0]["payload"] != "ada"


@pytest.mark.asyncio
async def test_check_reports_a_payload_it_cannot_decode(tmp_path: Path) -> None:
    await _encrypted_store(tmp_path)
    code, out, _ = await acli("check", "--data", str(tmp_path), "--codecs", KEYS)
    assert code == 0, out
    code, out, _ = await acli("check", "--data", str(tmp_path))
    assert code != 0
    assert "g-1" in out
    assert "codec 'aes-gcm'" in out


@pytest.mark.asyncio
async def test_codecs_that_do_not_import_are_one_clear_error(tmp_path: Path) -> None:
    await _encrypted_store(tmp_path)
    code, _, err = await acli("show", "g-1", "--data", str(tmp_path), "--codecs", "nowhere:X")
    assert code != 0
    assert "--codecs nowhere:X" in one_line_error(err)


def test_a_worker_with_codecs_encrypts_what_it_records_and_result_reads_it_back(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    with worker(tmp_path, "--codecs", KEYS):
        code, _, err = cli("start", f"{MODULE}:greet", "g-2", '"bo"', "--data", data)
        assert code == 0, err
        code, out, _ = cli(
            "result", "g-2", "--wait", "--timeout", "20", "--data", data, "--codecs", KEYS
        )
        assert json.loads(out) == "hello bo"
    code, out, _ = cli("show", "g-2", "--data", data, "--json")
    assert "hello bo" not in out  # the journal holds it encrypted

"""mypy --strict checks workflow inputs, signal and update payloads, and results and query
answers end to end."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

SNIPPET = textwrap.dedent(
    """
    import dataclasses
    import datetime
    from typing import Any

    import fusee
    import fusee.testing

    @dataclasses.dataclass
    class Progress:
        done: int

    review = fusee.signal("review", bool)
    bump = fusee.update("bump", int, str)
    progress = fusee.query("progress", Progress)
    status = fusee.query("status")

    @fusee.workflow("w")
    async def w(ctx: fusee.Ctx, n: int) -> str:
        return str(n)

    @fusee.workflow
    async def bare(ctx: fusee.Ctx) -> int:
        return 1

    # A list of different workflows, named: annotate it (mypy joins
    # WorkflowDef[int, str] and WorkflowDef[None, int] to object).
    WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [w, bare]

    async def main(engine: fusee.Engine) -> None:
        other = await fusee.Engine.open("memory", workflows=WORKFLOWS)
        await other.close()
        inline = await fusee.Engine.open("memory", workflows=[w, bare])
        await inline.close()
        run = await engine.start(w, "a", 1)
        text: str = await run.result()
        await run.signal(review, True)
        answer: str = await run.update(bump, 3)
        one: int = await engine.execute(bare, "b")
        done: Progress = await run.query(progress)
        plain: dict[str, int] = await run.query(status)
        async with await fusee.Client.connect("./data") as client:
            also: Progress = await client.get("a").query(progress)
        sync = fusee.SyncClient.connect("./data")
        again: Progress = sync.get("a").query(progress)
        count: int = await run.query(progress)  # error: wrong answer type
        counted: int = sync.get("a").query(progress)  # error: wrong answer type
        await engine.start(w, "c", "not an int")  # error: wrong input
        await run.signal(review, "yes")  # error: wrong payload
        await run.update(bump, "3")  # error: wrong payload
        wrong: int = await run.result()  # error: wrong result type

    # Engine, TestEngine and Client share one set of start/execute overloads.
    async def others(t: fusee.testing.TestEngine, client: fusee.Client) -> None:
        tested: fusee.Run[str] = await t.start(w, "a", 1, timeout="1h", delay="1m")
        counted: int = await t.execute(bare, "b", id_policy=fusee.IdPolicy.ATTACH)
        sent: fusee.Run[str] = await client.start(w, "c", 2, queue="q", key="k", priority=1)
        later = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
        bare_run: fusee.Run[int] = await client.start(bare, "d", start_at=later, debounce="1s")
        named: fusee.Run[Any] = await client.start("w", "e", {"any": "input"})
        await t.start(w, "f", "not an int")  # error: wrong input
        await t.execute(w, "g", "not an int")  # error: wrong input
        await client.start(w, "h", "not an int")  # error: wrong input
        mistaken: fusee.Run[int] = await client.start(w, "i", 1)  # error: wrong result type
        also_wrong: str = await t.execute(bare, "j")  # error: wrong result type
    """
)


def test_mypy_rejects_a_wrong_input_payload_or_result_type(tmp_path: Path) -> None:
    path = tmp_path / "snippet.py"
    path.write_text(SNIPPET)
    out, err, _ = api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(path)])
    lines = sorted(
        {int(line.split(":")[1]) for line in out.splitlines() if line.startswith(str(path))}
    )
    expected = [n for n, text in enumerate(SNIPPET.splitlines(), 1) if "# error:" in text]
    assert len(expected) == 11
    assert lines == expected, out + err

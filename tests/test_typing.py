"""mypy --strict checks workflow inputs, signal and update payloads, and results and query
answers end to end."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

SNIPPET = textwrap.dedent(
    """
    import dataclasses
    from typing import Any

    import fusee

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
    assert len(expected) == 6
    assert lines == expected, out + err

"""fusee.remote._token: the completion token's one format."""

from __future__ import annotations

import pytest

from fusee.remote import CompletionToken


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        pytest.param("order-1/1/4/2", ("order-1", 1, 4, 2), id="plain-id"),
        pytest.param("tenant/a/order-1/3/0/1", ("tenant/a/order-1", 3, 0, 1), id="id-with-slashes"),
    ],
)
def test_a_token_reads_back_the_parts_it_was_written_from(
    text: str, parts: tuple[str, int, int, int]
) -> None:
    token = CompletionToken.parse(text)
    assert (token.id, token.run, token.seq, token.attempt) == parts
    assert str(CompletionToken(*parts)) == text
    assert CompletionToken.run_id(text) == parts[0]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("order-1", id="no-parts"),
        pytest.param("order-1/1/x/2", id="not-a-number"),
        pytest.param(None, id="not-text"),
    ],
)
def test_what_is_no_token_is_refused_and_routed_nowhere(text: object) -> None:
    with pytest.raises(ValueError, match="is not an await_completion token"):
        CompletionToken.parse(text)
    assert CompletionToken.run_id(text) == ""

"""The completion token `ctx.await_completion` hands out: its format, written once.

A token names the run (its id and run number), the operation's position and
the attempt that handed it out: ``"order-1/1/4/2"``. An id may hold slashes,
so a token is read from its right end.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompletionToken"]


@dataclass(frozen=True, slots=True)
class CompletionToken:
    """A completion token's parts.

    Example:
        >>> token = CompletionToken.parse("orders/o-1/1/4/2")
        >>> token.id, token.seq, str(token)
        ('orders/o-1', 4, 'orders/o-1/1/4/2')
    """

    id: str
    run: int
    seq: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.id}/{self.run}/{self.seq}/{self.attempt}"

    @classmethod
    def parse(cls, token: object) -> CompletionToken:
        """The parts of ``token``.

        Raises:
            ValueError: ``token`` is not a token fusee handed out.

        Example:
            >>> CompletionToken.parse("a/1/0/1").run
            1
        """
        try:
            id, run, seq, attempt = token.rsplit("/", 3)  # type: ignore[attr-defined]
            return cls(id, int(run), int(seq), int(attempt))
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"{token!r} is not an await_completion token") from None

    @staticmethod
    def run_id(token: object) -> str:
        """The id of the run ``token`` belongs to, where it is routed ("" for what is no token).

        Example:
            >>> CompletionToken.run_id("a/1/0/1"), CompletionToken.run_id(None)
            ('a', '')
        """
        try:
            return CompletionToken.parse(token).id
        except ValueError:
            return ""

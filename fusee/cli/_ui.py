"""``fusee ui``: the web page of a store's runs (`fusee.ui`), with actions through a Client.

The rule: the page reads the store read-only and acts only through the
Client, so it can run beside the worker that writes the store.
"""

from __future__ import annotations

import argparse

from fusee.cli._output import CliError, Output
from fusee.cli._reading import codecs_of, store_shown, store_target
from fusee.errors import FuseeError

__all__ = ["ui_command"]


def ui_command(args: argparse.Namespace, out: Output) -> int:
    target = store_target(args)
    codecs = codecs_of(args)
    try:
        from fusee.ui import serve
        from fusee.ui._actions import ClientActions
    except ImportError as e:  # the `ui` extra is not installed
        raise FuseeError(
            f"fusee ui needs the ui extra ({e.name} is missing): pip install 'fusee[ui]'"
        ) from None
    out.say(
        (f"fusee ui: {store_shown(args)} on http://{args.host}:{args.port}/ (Ctrl-C stops)", "bold")
    )
    try:
        serve(
            target,
            args.host,
            args.port,
            args.token,
            actions=ClientActions(target, codecs=codecs),
            codecs=codecs,
        )
    except ValueError as e:  # another address without --token, a bad port
        raise CliError(str(e)) from None
    return 0

"""Runs reached through the store: what a process without workflow code needs.

`Remote` posts commands to the store's inbox and reads runs' rows and
journals; `fusee.Client`, the CLI and the UI build on it, and an engine on a
shared store uses one for the runs other workers serve.
"""

from __future__ import annotations

from fusee.remote._remote import Polling, Remote, answer_fields

__all__ = ["Polling", "Remote", "answer_fields"]

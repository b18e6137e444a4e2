"""Runs reached through the store: what a process without workflow code needs.

`Remote` posts commands to the store's inbox and reads runs' rows and
journals; `fusee.Client`, the CLI and the UI build on this package (and on
fusee's public names) only, and an engine on a store several workers share
uses a `Remote` for the runs other workers serve. Below the engine, above
the store: nothing here knows workflow code.
"""

from __future__ import annotations

from fusee.remote._info import KEEP_INPUT, RunInfo, check_id, dedup_key, row_info
from fusee.remote._journal import (
    decode_journal,
    end_record,
    end_value,
    error_pair,
    no_run,
    position,
    seq_of,
    text,
)
from fusee.remote._readers import (
    StreamReader,
    latest_event,
    never_set,
    queue_stats,
    read_event,
    timed_out,
)
from fusee.remote._remote import CLIENT_CLOSED, Polling, Remote
from fusee.remote._token import CompletionToken
from fusee.remote._trace import caller_trace
from fusee.remote._wire import (
    answer_fields,
    decode_error,
    decode_payload,
    encode_error,
    encode_payload,
)

__all__ = [
    "CLIENT_CLOSED",
    "KEEP_INPUT",
    "CompletionToken",
    "Polling",
    "Remote",
    "RunInfo",
    "StreamReader",
    "answer_fields",
    "caller_trace",
    "check_id",
    "decode_error",
    "decode_journal",
    "decode_payload",
    "dedup_key",
    "encode_error",
    "encode_payload",
    "end_record",
    "end_value",
    "error_pair",
    "latest_event",
    "never_set",
    "no_run",
    "position",
    "queue_stats",
    "read_event",
    "row_info",
    "seq_of",
    "text",
    "timed_out",
]

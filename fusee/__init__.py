# fusee: durable execution for Python, on asyncio.
#
# The layers, each using only the ones below it:
#
#   cli        the `fusee` command
#   client     Client, SyncClient: runs served elsewhere, through the store
#   testing    TestEngine: virtual clock, crashes, mocks
#   engine     Engine, Run handles, shards, steps, timers, group commit
#   store      Store protocol; memory, sqlite (loaded by name)
#   ------------------------------------------------------------------------
#   _driver    RunDriver: one run = machine + loop + coroutine; deliveries
#              become resolved futures, effects go to the host
#   context    Ctx, StepCtx: what workflow and step code call, written
#              against _runtime's Runtime protocol (never the driver)
#   _runtime   Runtime: what Ctx needs from its run; operation types
#   _loop      WorkflowLoop: a deterministic asyncio loop per run
#   _combinators  wait, as_completed, select: asyncio's, in list order
#   machine    RunMachine: the journal machine (pure: no I/O, no clock)
#   record     journal records and their encoding
#
# scripts/check_layers.py (make lint) holds the ranks and checks them.
#
# Public names are re-exported here; modules with a leading underscore are
# private.
"""Durable execution for Python, on asyncio, at the speed of the disk."""

from __future__ import annotations

from fusee import blobs, codecs
from fusee._combinators import as_completed, select, wait
from fusee._definitions import (
    QueryDef,
    Retry,
    SignalDef,
    UpdateDef,
    WorkflowDef,
    query,
    signal,
    update,
    workflow,
)
from fusee._events import EventDef, event
from fusee._queue import Queue, QueueStats
from fusee._schedule import Schedule
from fusee._status import RunStatus
from fusee._version import __version__ as __version__
from fusee.blobs import BlobStore
from fusee.client import Client, SyncClient
from fusee.codecs import PayloadCodec
from fusee.context import Ctx, StepCtx, UpdateInfo, WorkflowInfo, WorkflowStream, current_step
from fusee.engine import BulkResult, Engine, IdPolicy, Run, RunInfo
from fusee.errors import (
    AlreadyExists,
    Cancelled,
    ChildFailed,
    CorruptRecord,
    DeterminismError,
    Failure,
    FuseeError,
    NondeterministicCall,
    NotFound,
    PayloadError,
    PayloadTooLarge,
    QueryFailed,
    RunFinished,
    RunNotFinished,
    RunPaused,
    RunQueued,
    StaleLease,
    StepFailed,
    StoreError,
    UnknownQueue,
    UnknownWorkflow,
    UpdateFailed,
    UpdateRejected,
    WatchdogError,
    WorkflowFailed,
)

__all__ = [
    "AlreadyExists",
    "BlobStore",
    "BulkResult",
    "Cancelled",
    "ChildFailed",
    "Client",
    "CorruptRecord",
    "Ctx",
    "DeterminismError",
    "Engine",
    "EventDef",
    "Failure",
    "FuseeError",
    "IdPolicy",
    "NondeterministicCall",
    "NotFound",
    "PayloadCodec",
    "PayloadError",
    "PayloadTooLarge",
    "QueryDef",
    "QueryFailed",
    "Queue",
    "QueueStats",
    "Retry",
    "Run",
    "RunFinished",
    "RunInfo",
    "RunNotFinished",
    "RunPaused",
    "RunQueued",
    "RunStatus",
    "Schedule",
    "SignalDef",
    "StaleLease",
    "StepCtx",
    "StepFailed",
    "StoreError",
    "SyncClient",
    "UnknownQueue",
    "UnknownWorkflow",
    "UpdateDef",
    "UpdateFailed",
    "UpdateInfo",
    "UpdateRejected",
    "WatchdogError",
    "WorkflowDef",
    "WorkflowFailed",
    "WorkflowInfo",
    "WorkflowStream",
    "as_completed",
    "blobs",
    "codecs",
    "current_step",
    "event",
    "query",
    "select",
    "signal",
    "update",
    "wait",
    "workflow",
]

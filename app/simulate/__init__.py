"""`projector simulate`: the traffic model (workload), its I/O (drive) and the command (cli)."""

from app.simulate.drive import (
    CassandraMessageSink,
    FileOnlySink,
    KafkaSink,
    Report,
    SimulateError,
    drive,
    simulate,
)
from app.simulate.workload import T0_MS, Batch, Mix, SimParams, Workload

__all__ = [
    "T0_MS",
    "Batch",
    "CassandraMessageSink",
    "FileOnlySink",
    "KafkaSink",
    "Mix",
    "Report",
    "SimParams",
    "SimulateError",
    "Workload",
    "drive",
    "simulate",
]

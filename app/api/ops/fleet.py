"""The fleet view (issue 17): per partition, from what the workers export and Kafka's offsets.

Sources, all read-only:

* each URL of ``PROJECTOR_OPS_METRICS_URLS`` (a worker's ``GET /metrics``, or a running
  rebuild's ``--metrics-port``), scraped concurrently with a short timeout; a worker is the owner
  of the partitions its gauges are labelled with (``projector_watermark_hi{partition}`` and
  friends, app/metrics/worker.py). Configured, not discovered: Kafka's group membership does not say
  where a member serves /metrics. Two owners of one partition = a rebalance in flight (shown).
* the workers' consumer group (``PROJECTOR_APP_ID``) committed offsets and the log ends of
  mailbox-tail (the OpsBus port): the lag in records;
* the serving namespace (``{base}:serving`` in Redis).

`Sampler` keeps the last samples of the totals for the charts (lag and throughput over the last
minutes): the console process samples every ``ops_sample_interval_ms`` while it runs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from app.metrics import REBUILD_DIFF_KINDS

from .ports import OpsDeps, PartitionOffsets

log = logging.getLogger("projector.ops")

SCRAPE_TIMEOUT_S: Final = 3.0
SAMPLES: Final = 120


@dataclass(slots=True)
class Scrape:
    url: str
    ok: bool
    error: str = ""
    # (name, labels) -> value, every sample of the exposition
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def labelled(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(dict(labels), v) for (n, labels), v in self.samples.items() if n == name]


Fetch = Callable[[str], Awaitable[str]]


def parse(url: str, text: str) -> Scrape:
    out = Scrape(url, ok=True)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


async def scrape_all(urls: Sequence[str], fetch: Fetch) -> list[Scrape]:
    async def one(url: str) -> Scrape:
        try:
            text = await asyncio.wait_for(fetch(url), SCRAPE_TIMEOUT_S)
            return parse(url, text)
        except Exception as exc:  # down, refused, not Prometheus text: shown, never fatal
            return Scrape(url, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])

    return list(await asyncio.gather(*(one(url) for url in urls)))


def http_fetch(session: aiohttp.ClientSession) -> Fetch:
    async def fetch(url: str) -> str:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            return await resp.text()

    return fetch


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _rebuild_diff(sc: Scrape) -> dict[str, int | None] | None:
    """The rebuild's diff with the serving namespace; None until it has compared."""
    rows = {labels.get("kind", ""): value for labels, value in sc.labelled("projector_rebuild_diff_rows")}
    if not rows:
        return None
    out = {f"rows_{kind}": _int(rows.get(kind)) for kind in REBUILD_DIFF_KINDS}
    out["badges_differing"] = _int(sc.value("projector_rebuild_diff_badges"))
    return out


def summarize(
    scrapes: Sequence[Scrape], offsets: Sequence[PartitionOffsets] | None, partitions: int
) -> dict[str, Any]:
    """The fleet view's JSON: workers, partitions, rebuilds, totals."""
    workers: list[dict[str, Any]] = []
    rebuilds: list[dict[str, Any]] = []
    by_partition: dict[int, dict[str, Any]] = {}
    for sc in scrapes:
        if sc.ok and sc.value("projector_rebuild_work_items") is not None:
            names = [labels.get("namespace", "") for labels, _ in sc.labelled("projector_rebuild_info")]
            rebuilds.append(
                {
                    "url": sc.url,
                    "namespace": names[0] if names else None,
                    "items": _int(sc.value("projector_rebuild_work_items")),
                    "done": _int(sc.value("projector_rebuild_work_done")),
                    "ratio": sc.value("projector_rebuild_progress_ratio"),
                    "diff": _rebuild_diff(sc),
                }
            )
            continue
        worker: dict[str, Any] = {"url": sc.url, "up": sc.ok, "error": sc.error, "partitions": []}
        if sc.ok:
            worker.update(
                entries_in=_int(sc.value("projector_entries_in_total")),
                applied=_int(sc.value("projector_entries_applied_total")),
                duplicates=_int(sc.value("projector_entries_duplicate_total")),
                dead_letters=_int(sc.value("projector_entries_dead_lettered_total")),
                pending=_int(sc.value("projector_entries_pending")),
                flushes=_int(sc.value("projector_flushes_total")),
                last_flush=sc.value("projector_last_flush_timestamp_seconds"),
                drift_ratio=sc.value("projector_unread_drift_ratio"),
                audited_rows=_int(sc.value("projector_unread_audited_rows_total")),
                owed_rows_total=_int(sc.value("projector_state_owed_rows_total")),
                mirror_failures=_int(sc.value("projector_state_write_failures_total")),
            )
            for labels, hi in sc.labelled("projector_watermark_hi"):
                p = int(labels["partition"])
                worker["partitions"].append(p)
                entry = by_partition.setdefault(p, {"owners": []})
                entry["owners"].append(sc.url)
                lanes = {
                    lab["lane"]: int(v)
                    for lab, v in sc.labelled("projector_watermark_lane")
                    if lab.get("partition") == str(p)
                }
                entry.update(
                    hi=int(hi),
                    lanes=dict(sorted(lanes.items(), key=lambda kv: int(kv[0]))),
                    pending=_int(sc.value("projector_partition_pending", partition=str(p))),
                    watermark_lag=_int(sc.value("projector_watermark_lag", partition=str(p))),
                    owed_rows=_int(sc.value("projector_partition_owed_rows", partition=str(p))),
                    last_flush=worker["last_flush"],
                    dead_letters=worker["dead_letters"],
                    drift_ratio=worker["drift_ratio"],
                )
            worker["partitions"].sort()
        workers.append(worker)
    known = set(range(partitions)) | set(by_partition)
    for o in offsets or ():
        known.add(o.partition)
    offsets_by = {o.partition: o for o in offsets or ()}
    rows = []
    for p in sorted(known):
        entry = {"partition": p, "owners": [], **by_partition.get(p, {})}
        got = offsets_by.get(p)
        entry.update(
            committed=None if got is None else got.committed,
            end=None if got is None else got.end,
            lag=None if got is None else got.lag,
        )
        rows.append(entry)
    totals = {
        "applied": sum(w.get("applied") or 0 for w in workers),
        "lag": sum(o.lag for o in offsets) if offsets is not None else None,
        "watermark_lag": sum(r.get("watermark_lag") or 0 for r in rows),
        "pending": sum(w.get("pending") or 0 for w in workers),
    }
    return {"workers": workers, "partitions": rows, "rebuilds": rebuilds, "totals": totals}


@dataclass(slots=True)
class Fleet:
    """Reads the fleet for the console: the scrapes, the group offsets, the serving namespace."""

    deps: OpsDeps
    urls: tuple[str, ...]
    partitions: int
    base_namespace: str
    fetch: Fetch

    async def view(self) -> dict[str, Any]:
        scrapes_task = scrape_all(self.urls, self.fetch)
        offsets: list[PartitionOffsets] | None = None
        offsets_error = ""
        if self.deps.bus is None:
            offsets_error = "no Kafka adapter configured"
        scrapes = await scrapes_task
        if self.deps.bus is not None:
            try:
                offsets = await self.deps.bus.group_offsets()
            except Exception as exc:
                offsets_error = f"{type(exc).__name__}: {exc}"[:300]
        try:
            serving = await self.deps.serving()
        except Exception as exc:
            serving = f"unavailable ({type(exc).__name__})"
        out = summarize(scrapes, offsets, self.partitions)
        out.update(
            serving_namespace=serving,
            base_namespace=self.base_namespace,
            offsets_error=offsets_error,
            at=time.time(),
        )
        return out


class Sampler:
    """The last samples of the fleet's totals, for the charts."""

    def __init__(self, fleet: Fleet, interval_s: float, keep: int = SAMPLES) -> None:
        self.fleet = fleet
        self.interval_s = interval_s
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)

    async def sample(self) -> dict[str, Any]:
        view = await self.fleet.view()
        t = view["totals"]
        self.samples.append(
            {
                "t": view["at"],
                "applied": t["applied"],
                "lag": t["lag"],
                "watermark_lag": t["watermark_lag"],
                "pending": t["pending"],
            }
        )
        return view

    async def run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a sampler that dies would freeze the charts silently
                log.exception("ops console: sampling the fleet failed")
            await asyncio.sleep(self.interval_s)

    def series(self) -> dict[str, list[float | None]]:
        """Columns for the charts: time, entries applied per second, lag (records), watermark lag."""
        t: list[float | None] = []
        rate: list[float | None] = []
        lag: list[float | None] = []
        wlag: list[float | None] = []
        previous: dict[str, Any] | None = None
        for s in self.samples:
            t.append(s["t"])
            if previous is None or s["t"] <= previous["t"]:
                rate.append(None)
            else:
                # A worker restart resets its counter: a negative step is not a rate.
                rate.append(max(0.0, (s["applied"] - previous["applied"]) / (s["t"] - previous["t"])))
            lag.append(s["lag"])
            wlag.append(s["watermark_lag"])
            previous = s
        return {"t": t, "applied_per_s": rate, "lag": lag, "watermark_lag": wlag}

"""Metrics declared as data: each metric of a process is one :class:`MetricSpec` row in the body of
a :class:`MetricSet` subclass (kind, name, help, label names); instantiating the set builds every
row in one registry, and callers reach each metric as a typed attribute of the same name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Counter, Gauge or Histogram: the kinds the processes declare.
MetricT = TypeVar("MetricT", bound=MetricWrapperBase)


@dataclass(frozen=True, slots=True)
class MetricSpec(Generic[MetricT]):
    """One metric: its kind, its name (a counter's without the ``_total`` the client library adds on
    exposition), its help text and label names; the label sets exported from the start, at 0,
    before their first event (``made_at_start``); a histogram's buckets.

    Read on a :class:`MetricSet` class it is the row; read on an instance it is the metric built
    from it (the instance's own attribute of that name, set when the set is built)."""

    kind: type[MetricT]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    made_at_start: tuple[tuple[str, ...], ...] = ()
    buckets: tuple[float, ...] = LATENCY_BUCKETS

    @property
    def exposed_name(self) -> str:
        """The family name a scraper reads (what ``app.metrics.names`` returns for it)."""
        return self.name + "_total" if self.kind is Counter else self.name

    def build(self, registry: CollectorRegistry) -> MetricT:
        metric: MetricT
        if self.kind is Histogram:  # the one kind built with more than name, help and labels
            histogram = Histogram(self.name, self.help, self.labels, registry=registry, buckets=self.buckets)
            metric = cast(MetricT, histogram)
        else:
            metric = self.kind(self.name, self.help, self.labels, registry=registry)
        for values in self.made_at_start:
            metric.labels(*values)
        return metric

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> MetricSpec[MetricT]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> MetricT: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> MetricSpec[MetricT] | MetricT:
        # A descriptor without __set__: once MetricSet.__init__ has set the instance's attribute,
        # Python reads that and never comes here for an instance.
        if instance is None:
            return self
        raise AttributeError(f"{self.name} is read before its MetricSet was built")


class MetricSet:
    """The metrics declared as :class:`MetricSpec` rows of a subclass's body, built in ``registry``
    in the order they are declared."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attr, spec in self.declared().items():
            setattr(self, attr, spec.build(registry))

    @classmethod
    def declared(cls) -> dict[str, MetricSpec[Any]]:
        """The rows of the set, by attribute name."""
        return {attr: spec for attr, spec in vars(cls).items() if isinstance(spec, MetricSpec)}

    @classmethod
    def exposed_names(cls) -> tuple[str, ...]:
        """The family names the set exports, in the order declared."""
        return tuple(spec.exposed_name for spec in cls.declared().values())


def each_label(values: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """``made_at_start`` of a metric with one label: every one of ``values``."""
    return tuple((value,) for value in values)


@dataclass(slots=True)
class TotalsSeen:
    """For counters pulled from a source's running totals: the totals already added to them."""

    values: dict[str, int] = field(default_factory=dict)

    def delta(self, name: str, total: int) -> int:
        before = self.values.get(name, 0)
        self.values[name] = total
        # A total below what was seen (a new core after a restart in the same process) restarts.
        return total - before if total >= before else total

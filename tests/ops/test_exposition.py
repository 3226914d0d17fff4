"""The text format the agent writes itself (agent.runtime.exposition), read back by the
Prometheus client library's parser, beside what that library writes for the same families."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from agent.runtime.exposition import Family, text
from agent.runtime.metrics import process_families

Parsed = list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]


def parsed(exposition: bytes) -> Parsed:
    return [
        (f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(exposition.decode())
    ]


def theirs(*families: object) -> bytes:
    class Fixed:
        def collect(self) -> list[object]:
            return list(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())  # type: ignore[arg-type]
    return generate_latest(registry)


label_values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
values = st.floats(allow_nan=False) | st.integers(0, 2**53).map(float)


@given(label_values, label_values, values, st.text(max_size=40))
def test_a_gauge_and_a_counter_read_back_as_the_librarys(
    device: str, point: str, value: float, doc: str
) -> None:
    gauge = Family("agent_device_setpoint_celsius", doc, "gauge", ("device", "point"))
    gauge.add((device, point), value)
    counter = Family("agent_role_changes", doc, "counter", ("reason",))
    counter.add((point,), abs(value))
    empty = Family("agent_line_cycle_seconds", doc, "gauge")
    their_gauge = GaugeMetricFamily(gauge.name, doc, labels=["device", "point"])
    their_gauge.add_metric([device, point], value)
    their_counter = CounterMetricFamily(counter.name, doc, labels=["reason"])
    their_counter.add_metric([point], abs(value))
    their_empty = GaugeMetricFamily(empty.name, doc)
    ours = text([gauge, counter, empty])
    assert parsed(ours) == parsed(theirs(their_gauge, their_counter, their_empty))


def test_a_histogram_reads_back_as_the_librarys() -> None:
    buckets = [("0.01", 2.0), ("0.1", 5.0), ("+Inf", 7.0)]
    ours = Family("agent_line_transaction_seconds", "A transaction's time.", "histogram",
                  ("line", "function"))  # fmt: skip
    ours.add_histogram(("t-1", "read"), buckets, 0.42)
    their = HistogramMetricFamily(ours.name, ours.doc, labels=["line", "function"])
    their.add_metric(["t-1", "read"], buckets, sum_value=0.42)
    assert parsed(text([ours])) == parsed(theirs(their))


def test_special_values_and_a_counter_named_with_its_suffix() -> None:
    family = Family("agent_x_total", "x", "counter", ("k",))
    family.add(("a",), math.inf)
    gauge = Family("agent_y", "y", "gauge", ("k",))
    gauge.add(("n",), math.nan)
    gauge.add(("m",), -math.inf)
    written = text([family, gauge]).decode()
    assert 'agent_x_total{k="a"} +Inf' in written
    assert 'agent_y{k="n"} NaN' in written and 'agent_y{k="m"} -Inf' in written
    assert "# TYPE agent_x_total counter" in written


def test_a_sample_with_the_wrong_number_of_labels_is_refused() -> None:
    family = Family("agent_y", "y", "gauge", ("device",))
    with pytest.raises(ValueError, match="agent_y"):
        family.add((), 1.0)


def test_the_process_families_are_the_librarys_process_collectors() -> None:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    library = parsed(generate_latest(registry))
    ours = parsed(text(process_families()))
    assert {n: (kind, doc) for n, kind, doc, _ in ours} == {n: (k, d) for n, k, d, _ in library}
    value = {name: samples[0][2] for name, _, _, samples in ours}
    theirs = {name: samples[0][2] for name, _, _, samples in library}
    assert value["process_start_time_seconds"] == pytest.approx(
        theirs["process_start_time_seconds"], abs=0.05
    )
    assert value["process_max_fds"] == theirs["process_max_fds"]
    # Read after the library (its sum of the two tick counts rounds apart from ours).
    assert value["process_cpu_seconds"] >= theirs["process_cpu_seconds"] - 1e-9
    assert 1e6 < value["process_resident_memory_bytes"] < value["process_virtual_memory_bytes"]
    assert value["process_open_fds"] > 0
    assert value["process_start_time_seconds"] < time.time()

"""Metric streams: ``--metrics`` files (CSV or JSONL) and the progress line.

Each computed point of a ``metric`` tensor is one row: the tensor's name, its dim indices
and its value, written and flushed at once so that nothing is lost if a run fails.
CSV has the header ``name,<dims>,value`` over every dim any metric has, in declaration
order, with empty cells for dims a metric lacks; JSONL rows are
``{"name": ..., "<dim>": index, ..., "value": ...}``.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time

import numpy as np


class MetricsFile:
    def __init__(self, path: str, dims: list[str]):
        self.path = path
        self.dims = dims
        self.jsonl = path.endswith(".jsonl")
        self.fh = open(path, "w", newline="")
        if not self.jsonl:
            self.csv = csv.writer(self.fh)
            self.csv.writerow(["name", *dims, "value"])
            self.fh.flush()

    def write(self, name: str, point: dict, value):
        value = plain(value)
        if self.jsonl:
            row = {
                "name": name,
                **{d: point[d] for d in self.dims if d in point},
                "value": _json_number(value),
            }
            self.fh.write(json.dumps(row) + "\n")
        else:
            self.csv.writerow([name, *[point.get(d, "") for d in self.dims], value])
        self.fh.flush()

    def close(self):
        self.fh.close()


def plain(value):
    """A NumPy scalar as the Python number with the shortest text that reads back the same
    (so an f32 metric 0.1 is written 0.1, not 0.10000000149011612)."""
    if isinstance(value, (np.floating, float)):
        return float(str(value)) if isinstance(value, np.floating) else value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _json_number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN or infinity
    return v


class Progress:
    """One status line on stderr, refreshed at most ten times a second."""

    def __init__(self, outer_dim: str | None, outer_extent: int | None, stream=sys.stderr):
        self.outer = outer_dim
        self.extent = outer_extent
        self.latest: dict[str, float] = {}
        self.stream = stream
        self.shown = 0.0
        self.position = None

    def update(self, name: str, point: dict, value):
        self.latest[name] = plain(value)
        if self.outer is not None and self.outer in point:
            self.position = point[self.outer]
        now = time.monotonic()
        if now - self.shown >= 0.1:
            self.shown = now
            self._draw()

    def _draw(self):
        head = ""
        if self.position is not None and self.extent:
            head = f"{self.outer} {self.position + 1}/{self.extent}  "
        values = "  ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.latest.items()
        )
        self.stream.write("\r\x1b[K" + head + values)
        self.stream.flush()

    def close(self):
        if self.latest:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

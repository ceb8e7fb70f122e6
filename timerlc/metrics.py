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
    """The progress display: one line per iteration of the outermost dim of the metrics, with
    the latest value of each metric and the time so far, written when the next iteration
    starts (and at the end)."""

    def __init__(self, outer_dim: str | None, outer_extent: int | None, stream=sys.stderr):
        self.outer = outer_dim
        self.extent = outer_extent
        self.latest: dict[str, object] = {}
        self.stream = stream
        self.position = None
        self.started = time.monotonic()
        self.pending = False

    def update(self, name: str, point: dict, value):
        pos = point.get(self.outer) if self.outer is not None else None
        if pos is not None and self.position is not None and pos != self.position and self.pending:
            self._line()
        if pos is not None:
            self.position = pos
        self.latest[name] = plain(value)
        self.pending = True

    def _line(self):
        head = ""
        if self.position is not None:
            head = f"{self.outer} {self.position + 1}"
            head += f"/{self.extent}  " if self.extent else "  "
        values = "  ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.latest.items()
        )
        self.stream.write(f"{head}{values}  ({time.monotonic() - self.started:.1f} s)\n")
        self.stream.flush()
        self.pending = False

    def close(self):
        if self.pending:
            self._line()

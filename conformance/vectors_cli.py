"""``attnspec vectors export | verify | run``: the command line of `attnspec.conformance.vectors`."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, usage_error: type[Exception]) -> None:
    vectors = sub.add_parser("vectors", help="conformance vectors: export a bundle, verify outputs, run a backend")
    vectors.set_defaults(run=lambda args: (vectors.print_help(), 2)[1])

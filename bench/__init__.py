"""The benchmark harness: times backends, their memory and the Reformer libraries, and writes
``attnspec.bench/1`` results JSON (reports/SCHEMA.md) for `attnspec.reports` to render.

    python -m attnspec.bench.run --backend NAME [--grid quick|full|lsh] ...   (nox -s bench)
    python -m attnspec.bench.reformer                                          (nox -s bench-torch)

`run` is the command line; `grid` the cases and the implementations timed; `measure` the timing
and peak-memory methods; `targets` the performance targets; `reformer` torch's LSH against the
two Reformer libraries.
"""

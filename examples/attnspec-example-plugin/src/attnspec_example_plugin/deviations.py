"""The declared deviations of this plugin's backends, as data: ``deviations.toml`` beside this
file, in the same format as attnspec's own catalogue (`attnspec.backends.deviations`), read by
`attnspec.backends.deviations.load`. Each entry's reproducer is a script in ``reproducers/``;
its case and test are functions of `attnspec_example_plugin.cases`. A backend lists its entries
in its class attribute ``deviations``; the conformance suite then counts a failing case that
carries an entry's ``tags`` as that deviation, and reports an entry whose cases all pass as
stale."""

from __future__ import annotations

from pathlib import Path

from attnspec.backends.deviations import load

__all__ = ["NAN_ROWS_DEVIATIONS"]

NAN_ROWS_DEVIATIONS = load(Path(__file__).with_name("deviations.toml"))

"""The atlas: outside implementations of attention as native backends, measured against the spec.

Each is a raw primitive called through a calling convention (`attnspec.backends.conventions.atlas`)
with no fix-up: `attnspec.backends.atlas.natives` builds them, `attnspec.backends.atlas.questions`
asks each the semantic questions the spec decides, and the declared deviations are data in
``deviations.toml`` beside this file. ``nox -s atlas`` runs them and renders ``reports/atlas.md``.
"""

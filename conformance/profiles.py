"""The suite's Hypothesis profiles: how many examples each property draws.

One table, read by the pytest plugin (which registers the profiles), the runner, `attnspec check`
and nox. ``default`` is what `nox -s conformance` runs when no profile is named; a run takes
minutes on two cores (docs/guide/performance.md). ``thorough`` is the deep run, one flag away.
"""

from __future__ import annotations

#: name -> (examples per property and dtype, derandomized: the same cases on every run)
PROFILE_EXAMPLES: dict[str, tuple[int, bool]] = {
    "dev": (12, True),  # CI's quick run and the kit's own mutant tests
    "default": (25, True),  # the main job
    "ci": (100, True),  # Hypothesis' own default count, as array-api-tests runs it
    "thorough": (1000, False),  # fresh random cases each run
}
PROFILES = tuple(PROFILE_EXAMPLES)
DEFAULT_PROFILE = "default"

"""``python -m attnspec.reports``: the same as ``python -m attnspec.reports.render``."""

import sys

from attnspec.reports.render import main

sys.exit(main())

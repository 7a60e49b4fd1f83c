"""``python -m attnspec``: the ``attnspec`` command (see `attnspec.cli`)."""

import sys

from attnspec.cli import main

sys.exit(main())

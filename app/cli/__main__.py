"""``python -m app.cli`` (how ``liar app`` starts its embedded worker)."""

import sys

from app.cli import main

sys.exit(main())

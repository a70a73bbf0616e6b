"""``python -m ctrctl``."""

import sys

from ctrctl.cli.app import main

sys.exit(main())

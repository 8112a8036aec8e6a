"""``python -m flowscope`` is the ``flowscope`` command."""

import sys

from flowscope.cli.main import main

sys.exit(main())

"""``python -m flowscope`` is the ``flowscope`` command."""

import sys

from flowscope.cli.main import main

if __name__ == "__main__":  # worker processes spawned by a LocalCluster re-import this module
    sys.exit(main())

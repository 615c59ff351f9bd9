"""`python -m kiteq.cli.admin`, the same as the `kiteq-admin` console script."""

import sys

from kiteq.cli.admin import main

sys.exit(main())

"""``python -m dist_resume``: the ``dist-resume`` command."""

import sys

from dist_resume.cli import main

sys.exit(main())

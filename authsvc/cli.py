"""The old path of authsvc/admin/command.py, kept for one release (README.md, "Layout"): ``python -m authsvc.cli``."""

import sys

from authsvc.admin.command import main as main

if __name__ == "__main__":
    sys.exit(main())

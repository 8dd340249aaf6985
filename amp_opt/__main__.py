"""``python -m amp_opt``: the command-line interface."""

from .cli import main

raise SystemExit(main())

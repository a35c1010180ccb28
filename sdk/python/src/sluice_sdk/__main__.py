"""``python -m sluice_sdk MODULE:APP --acceptor HOST:PORT ...``: see :mod:`sluice_sdk.runner`."""

from .runner import main

raise SystemExit(main())

"""``python -m monitor`` is the ``relmon`` command."""

from monitor.cli import main

raise SystemExit(main())

"""``python -m monitor`` is the ``relmon`` command."""

from monitor.app.cli import main

raise SystemExit(main())

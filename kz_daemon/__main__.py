from kz_daemon.cli import main

raise SystemExit(main())

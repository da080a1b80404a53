from tracelens.cli import main

raise SystemExit(main())

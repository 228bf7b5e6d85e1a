from monarch.cli import main

raise SystemExit(main())

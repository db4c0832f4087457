from seamkit.cli import main

raise SystemExit(main())

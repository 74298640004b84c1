from edge_spec.cli import main

raise SystemExit(main())

from pgfence.cli.main import main

raise SystemExit(main())

from attrib_agent.cli import main

raise SystemExit(main())

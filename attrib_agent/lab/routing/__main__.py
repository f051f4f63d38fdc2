"""`python -m attrib_agent.lab.routing`: the routing study (same as `attrib-agent lab routing-study`)."""

from attrib_agent.lab.routing.study import main

raise SystemExit(main())

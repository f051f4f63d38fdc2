"""`python -m attrib_agent.lab.oracle`: vLLM's scheduler vs the re-simulation, step agreement report."""

from __future__ import annotations

import argparse

from attrib_agent.lab.oracle.suite import add_arguments, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m attrib_agent.lab.oracle", description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))

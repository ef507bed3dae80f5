"""The MCP SDK this environment needs, checked at service start.

The environment is written against the 2.x SDK (``mcp.types.Tool.input_schema``, ``streamable_http_client``).
A third-party MCP server that pins the 1.x SDK, installed with pip into the service's virtualenv, downgrades
the SDK there, and the environment then failed at start-up with ``AttributeError: 'Tool' object has no
attribute 'input_schema'``, naming an attribute instead of the version mismatch. This check names the version
found, the version needed, and the fix: the server gets a virtualenv of its own (a 1.x server talks to the 2.x
client over stdio or HTTP unchanged), and the SDK here is restored.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

__all__ = ["MIN_SDK", "sdk_problem"]

#: The oldest MCP SDK (PyPI package ``mcp``) the environment runs on; constraints.txt pins the tested one.
MIN_SDK = "2.0.0"


def sdk_problem() -> str | None:
    """What is wrong with the installed MCP SDK (None = it is new enough), with the fix."""
    try:
        found = metadata.version("mcp")
    except metadata.PackageNotFoundError:
        return ("the MCP SDK (PyPI package `mcp`) is not installed in this Python; install the mcp extra: "
                "pip install -c constraints.txt -e '.[mcp]' (docs/env_mcp.md)")
    try:
        too_old = Version(found) < Version(MIN_SDK)
    except InvalidVersion:
        return None  # a development build: let the imports speak
    if not too_old:
        return None
    return (f"the MCP SDK installed here is mcp {found}; this environment needs mcp>={MIN_SDK}. Something pip "
            "installed into this virtualenv (usually an MCP server that pins the 1.x SDK) downgraded it. Give that "
            "server a virtualenv of its own and point the config's `command` at it, e.g.\n"
            "  python -m venv ~/.venvs/my-server && ~/.venvs/my-server/bin/pip install my-mcp-server\n"
            "  servers: [{name: my, command: [/home/me/.venvs/my-server/bin/my-mcp-server]}]  (an absolute path)\n"
            "then restore the SDK here: pip install -c constraints.txt 'mcp' (docs/env_mcp.md, \"A server with "
            "dependencies of its own\")")

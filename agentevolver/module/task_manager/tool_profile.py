"""A profile derived from an environment's tool list, for environments that ship none (``mcp``: any server).

Self-Questioning needs a profile (what the environment is about) to point the explorer at operations and to
tell the writer and the judge what a sensible task looks like. An environment whose whole surface is its
tools - an MCP server - already says that in its ``list_tools`` answer: each tool is an operation, its
parameters are the attributes of what it acts on. So when ``task_manager.env_profile`` is null and no
profile is shipped for ``env_service.env_type``, the profile is built from the service's
``GET /envs/{env_type}/tools``: one entity per tool. A hand-written profile file (``task_manager.env_profile``)
refines it; ``python -m agentevolver.module.task_manager.tool_profile`` prints the derived one as a start.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agentevolver.module.task_manager.profile import Attribute, Entity, EnvProfile, Operation

__all__ = ["profile_from_tools"]


def _line(text: Any, fallback: str) -> str:
    first = str(text or "").strip().splitlines()
    return first[0].strip() if first and first[0].strip() else fallback


def profile_from_tools(env_type: str, tools: Sequence[Mapping[str, Any]], description: str | None = None) -> EnvProfile:
    """One entity per tool (OpenAI function format): the tool is its operation, its parameters its attributes."""
    entities = []
    for tool in tools:
        function = tool.get("function", tool)
        name = str(function["name"]).strip()
        summary = _line(function.get("description"), f"the tool {name}")
        properties = (function.get("parameters") or {}).get("properties") or {}
        attributes = [Attribute(name=str(arg).strip(), description=_line(
            spec.get("description") if isinstance(spec, Mapping) else None,
            f"{spec.get('type', 'value') if isinstance(spec, Mapping) else 'value'} argument of {name}"))
            for arg, spec in properties.items() if str(arg).strip()]
        entities.append(Entity(name=name, description=f"what {name} works on: {summary}", attributes=attributes,
                               operations=[Operation(name=name, description=summary)]))
    if not entities:
        raise ValueError(f"environment {env_type!r} lists no tools, so no profile can be derived from them; "
                         "write one and set task_manager.env_profile to its path")
    names = ", ".join(e.name for e in entities[:12]) + (", ..." if len(entities) > 12 else "")
    return EnvProfile(env_type=env_type, entities=entities,
                      description=description or f"An environment whose tools are {names}. Tasks are solved by "
                                                 "calling these tools and reporting what they return.")


def main(argv: list[str] | None = None) -> int:
    """Print the derived profile of a running service's environment (a starting point for a refined file)."""
    from agentevolver.client.env_client import EnvClient, EnvClientSettings

    parser = argparse.ArgumentParser(prog="python -m agentevolver.module.task_manager.tool_profile",
                                     description=main.__doc__)
    parser.add_argument("env_type")
    parser.add_argument("--env-url", default="http://127.0.0.1:8080")
    args = parser.parse_args(argv)
    with EnvClient(EnvClientSettings(env_url=args.env_url)) as env:
        tools = env.tools(args.env_type) or []
    json.dump(profile_from_tools(args.env_type, tools).model_dump(exclude_none=True), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

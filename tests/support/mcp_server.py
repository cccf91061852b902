"""A small MCP server for the MCP tests, built with the SDK's server API.

``python tests/support/mcp_server.py stdio`` serves over stdio; ``... http PORT`` serves Streamable HTTP
on 127.0.0.1:PORT at /mcp; ``... garbage`` prints non-JSON on stdout (a broken server).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("hearth-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def slow(seconds: float) -> str:
    """Sleep for some seconds, then answer."""
    time.sleep(seconds)
    return "done"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ValueError(why)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "garbage":
        # a server that writes logs to stdout instead of JSON-RPC, then reads stdin forever
        sys.stdout.write("Starting up... this is not JSON\n")
        sys.stdout.flush()
        for _ in sys.stdin:
            sys.stdout.write("still not JSON\n")
            sys.stdout.flush()
        return
    if mode == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
        return
    server.run("stdio")


if __name__ == "__main__":
    main()

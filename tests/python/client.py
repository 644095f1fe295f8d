"""Outside view of the gateway through the official Python MCP SDK.

Usage: client.py URL TOKEN [MODE]. Connects in MODE (the SDK's default `auto`, which probes
`server/discover` and takes 2026-07-28 from a gateway that serves it; or `legacy`, the
initialize handshake), lists tools, calls one, calls an unknown one, and prints a JSON report
for the Rust test to check, with the protocol version negotiated.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


async def main(url: str, token: str, mode: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            listed = await client.list_tools()
            names = sorted(tool.name for tool in listed.tools)
            result = await client.call_tool("stripe.charges.list", {"limit": 2})
            text = "".join(block.text for block in result.content if block.type == "text")
            try:
                await client.call_tool("stripe.does_not_exist", {})
                unknown = {"code": None, "message": None}
            except MCPError as error:
                unknown = {"code": error.code, "message": error.message, "data": error.data}
            report = {
                "protocol": client.protocol_version,
                "tools": names,
                "call": {"isError": bool(result.is_error), "text": text},
                "unknown": unknown,
            }
            print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "auto"))

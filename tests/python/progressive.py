"""Outside view of progressive mode through the official Python MCP SDK.

Usage: progressive.py URL TOKEN IDEMPOTENCY_KEY QUERY [APPROVAL_ID APPROVAL_TOKEN]. Lists the
tools and asks search_tools for QUERY in one session; then, in a second session whose calls
carry the Idempotency-Key (and the approval headers when given), calls the first hit through
call_tool with a refund's arguments. Prints a JSON report: the listed names, the hits, the
first hit's input schema, and the call's result or error (code, message, data).
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


async def main(url: str, token: str, key: str, query: str, approval: list[str]) -> None:
    report = {}
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            listed = await client.list_tools()
            report["tools"] = sorted(tool.name for tool in listed.tools)
            found = await client.call_tool("search_tools", {"query": query})
            hits = found.structured_content["tools"]
            report["hits"] = [hit["name"] for hit in hits]
            report["first_schema"] = hits[0]["inputSchema"]

    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    if approval:
        headers["Obol-Approval-Id"], headers["Obol-Approval-Token"] = approval
    http = create_mcp_http_client(headers=headers)
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            try:
                result = await client.call_tool(
                    "call_tool",
                    {
                        "name": report["hits"][0],
                        "arguments": {"charge": "ch_py", "amount": 700},
                    },
                )
                text = "".join(b.text for b in result.content if b.type == "text")
                report["call"] = {"isError": bool(result.is_error), "text": text}
            except MCPError as error:
                report["call"] = {
                    "code": error.code,
                    "message": error.message,
                    "data": error.data,
                }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))

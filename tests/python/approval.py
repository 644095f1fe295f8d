"""Outside view of a held call through the official Python MCP SDK.

Usage: approval.py URL TOKEN IDEMPOTENCY_KEY [APPROVAL_ID APPROVAL_TOKEN]. Calls
stripe.create_refund under the given key (in the SDK's default `auto` mode: 2026-07-28 when
the gateway serves it), with the approval headers when given, and prints a JSON report: the
protocol version, and the error (code, message, data) when the call is held or refused, else
the result.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


async def main(url: str, token: str, key: str, approval: list[str]) -> None:
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    if approval:
        headers["Obol-Approval-Id"], headers["Obol-Approval-Token"] = approval
    http = create_mcp_http_client(headers=headers)
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            try:
                result = await client.call_tool(
                    "stripe.create_refund", {"charge": "ch_py", "amount": 700}
                )
                text = "".join(b.text for b in result.content if b.type == "text")
                report = {"isError": bool(result.is_error), "text": text}
            except MCPError as error:
                report = {"code": error.code, "message": error.message, "data": error.data}
            report["protocol"] = client.protocol_version
            print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))

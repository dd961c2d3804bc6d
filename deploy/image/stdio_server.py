"""A stdio MCP server with nothing but Python's standard library, for the
image check (deploy/image/ci.sh): the gateway in a derived image with Python
runs it as its child.

One tool, `echo`, that returns its `message`. Newline-delimited JSON-RPC on
stdin/stdout (MCP's stdio transport). When stdin closes, which is how the
gateway ends the session, it says so on stderr (the gateway logs its
children's stderr) and exits 0.
"""

import json
import sys

TOOLS = [
    {
        "name": "echo",
        "description": "Returns its message.",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    }
]


def answer(request):
    """The result of one request, or None for a notification."""
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "image-check-stdio", "version": "1.0.0"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call" and params.get("name") == "echo":
        message = str((params.get("arguments") or {}).get("message", ""))
        return {"content": [{"type": "text", "text": message}], "isError": False}
    if method == "ping":
        return {}
    raise LookupError(method)


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification (initialized, cancelled, ...)
        reply = {"jsonrpc": "2.0", "id": request["id"]}
        try:
            reply["result"] = answer(request)
        except LookupError as missing:
            reply["error"] = {"code": -32601, "message": f"no method {missing}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    print("image-check-stdio: stdin closed, exiting", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

"""One `run` of a command through `spillway mcp`, from the official Python MCP SDK: prints
`seconds saved`. The MCP server is started under /usr/bin/time, which writes its wall time and
peak RSS to TIME_FILE when it exits.

Usage: mcp_run.py SPILLWAY_BINARY TIME_FILE COMMAND   (SPILLWAY_URL/TOKEN or nothing in the env)
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client


async def main(binary, time_file, command):
    params = StdioServerParameters(
        command="/usr/bin/time", args=["-f", "%e %M", "-o", time_file, binary, "mcp"], env=dict(os.environ)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            start = time.monotonic()
            r = await s.call_tool("run", {"command": command}, read_timeout_seconds=600)
            took = time.monotonic() - start
            receipt = json.loads("".join(c.text for c in r.content if getattr(c, "type", "") == "text"))
            print(f"{took:.2f} {receipt['stdout']['saved']}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

"""The MCP server (official ``mcp`` SDK): the same tools over Streamable HTTP and stdio.

* ``server.py`` -- the tools (docs/api.md §5), built by ``build_server(runtime, resolve)``;
  ``resolve`` names the calling agent for each call, so the tools never guess who asks;
* ``http.py`` -- ``install(app, runtime)``: ``/mcp`` in the FastAPI app, every request
  authenticated with an agent token before the MCP layer sees it;
* ``stdio.py`` -- ``run_stdio(db_url, token)``: ``tidings mcp`` for one agent.
"""

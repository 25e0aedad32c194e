"""The MCP tools of an agent's run, as its tool loop sees them: what mcp.py finds on the
agent's servers, the toolset offers and a tool call calls. A leaf of its own, so that the
runtime's port (port.py) and a tool call can name them without loading mcp.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class McpTool:
    """One MCP server's tool as the agent's tool loop sees a tool."""

    name: str
    server: str
    url: str
    description: str
    parameters: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    context_values: dict[str, str] = field(default_factory=dict)
    is_predefined: bool = False
    condition: None = None
    # The OAuth app of a server skipped for want of a token, for its connect_<server> tool.
    connect_app: str = ""

    @property
    def ref(self) -> str:
        return self.name if self.connect_app else f"mcp:{self.server}.{self.name}"


@dataclass
class McpTools:
    listed: dict[str, McpTool] = field(default_factory=dict)
    discoverable: list[McpTool] = field(default_factory=list)

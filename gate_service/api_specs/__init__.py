"""`api:` tools (spec 3.3): OpenAPI specs stored per project under a prefix, each operation a
tool the project's agents may list, called by the model gateway on the case's behalf."""

from .openapi import PREFIX, ApiSpec, convert, loader_tools, tool_name

__all__ = ["PREFIX", "ApiSpec", "convert", "loader_tools", "tool_name"]

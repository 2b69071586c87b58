"""The agent card of an assistant (A2A 1.0's AgentCard, with 0.3's `url` fields beside):
one agent per assistant, its one skill the assistant itself. Pure."""

from __future__ import annotations

from typing import Any

from shared.assistants.model import Assistant

MODES = ["text/plain", "application/json"]
PROTOCOL_VERSION = "1.0"
SECURITY_SCHEMES: dict[str, Any] = {
    "apiKey": {"apiKeySecurityScheme": {"location": "header", "name": "x-api-key"}},
    "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}},
}


def agent_url(root: str, assistant: Assistant) -> str:
    """Where the assistant's JSON-RPC endpoint is, under this server's root URL."""
    return f"{root.rstrip('/')}/a2a/{assistant.assistant_id}"


def card(assistant: Assistant, root: str, *, version: str, keyed: bool) -> dict[str, Any]:
    """The card of `assistant` served from `root`; `keyed`: calls need threadrun's
    credentials (`x-api-key`, or a bearer token)."""
    url = agent_url(root, assistant)
    description = assistant.description or f"{assistant.name} ({assistant.graph_id}) assistant"
    out: dict[str, Any] = {
        "name": assistant.name,
        "description": description,
        "version": version,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}
        ],
        # 0.3's fields for its clients (a 1.x client reads supportedInterfaces)
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": MODES,
        "defaultOutputModes": MODES,
        "skills": [
            {
                "id": f"{assistant.assistant_id}-main",
                "name": assistant.name,
                "description": description,
                "tags": ["assistant", "langgraph", assistant.graph_id],
                "examples": [],
                "inputModes": MODES,
                "outputModes": MODES,
            }
        ],
    }
    if keyed:
        out["securitySchemes"] = SECURITY_SCHEMES
        out["securityRequirements"] = [
            {"schemes": {name: {"list": []}}} for name in SECURITY_SCHEMES
        ]
    return out

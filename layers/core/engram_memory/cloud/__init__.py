"""The cloud host: one tenant's AWS stack, composed in ``composition.py`` (the embedded host's sibling).

- ``wire``: the invocation event between the MCP adapter and the tool functions (and into an
  execution): ``{tool, arguments, context, approval}``, no credential;
- ``settings``: each function kind's environment, parsed once by its own pydantic model (one
  line per missing or invalid variable); every AWS client with ``client_config``;
- ``composition``: the engine and the execution gate, built from the settings;
- ``tool_handler``: the six tool functions' handler (``functions/<tool>/app.py``);
- ``workflow_runs`` and ``approvals``: withdraw/forget through their Step Functions execution
  (parked task tokens: ``engine.gate.Approval`` and what the item keeps beside it);
- ``workflow``: the state machines' Task steps; ``approval_page``: the URL-mode approval page;
- ``mcp_adapter``: the MCP surface as a Lambda, one tool invocation per MCP request;
- ``drainer``: the scheduled outbox drainer.

``adapters.aws`` holds only the port implementations (DynamoDB store, KMS vault, OpenSearch
index); nothing there imports this package.
"""

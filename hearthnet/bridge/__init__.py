"""``hearthnet bridge``: a node's pub/sub and call frames as JSON lines over stdin and
stdout, so that any language's pipes can drive a node (docs/bridge.md)."""

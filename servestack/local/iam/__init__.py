"""IAM enforcement for local mode (see servestack/local/iam/__init__ docstring, written at the end)."""

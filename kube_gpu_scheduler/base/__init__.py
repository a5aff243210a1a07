"""Base: settings tables, JSON logging and argument types; imports nothing of ours."""

"""Helpers shared by the integration tests (no fixtures here: tests/integration/fixtures_*.py)."""

"""Test support: pytest fixtures that start the real components (imported by tests/ and e2e/ conftest)."""

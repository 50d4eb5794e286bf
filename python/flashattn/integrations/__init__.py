"""Integrations of flashattn with other libraries (each an optional dependency)."""

"""Thin Qt table models, testable without a view."""

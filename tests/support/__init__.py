"""Helpers shared by the tests: fake servers, file builders, process drivers (no tests here)."""

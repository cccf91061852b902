"""Remote engines as providers (issue #11): the HTTP client and each engine's quirks."""

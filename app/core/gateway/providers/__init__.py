"""Remote engines as providers (issue #11): their configs and keys (store), and the pool that
probes them and serves their models (pool)."""

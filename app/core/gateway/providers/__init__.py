"""Remote engines as providers: their configs and keys (store), and the pool that
probes them and serves their models (pool)."""

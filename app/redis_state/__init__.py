"""State several gateways share, kept in Redis (or Valkey): rate-limit buckets, named keys, the
response cache, provider health. ``hearth serve --state redis://...`` turns it on; without it
every piece stays in process. The core defines what each piece does; this package keeps it in
Redis and falls back to the in-process piece while Redis cannot be reached."""

"""The embedded aiohttp server: OpenAI routes and Hearth's native API over the core."""

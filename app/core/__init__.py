"""Hearth's core: pure Python and asyncio. No Qt, no aiohttp, no runtime library."""

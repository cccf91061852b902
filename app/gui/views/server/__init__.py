"""The Server page (page.py) and its sections: the request log, the API keys, the response
cache, and the charts of the last generations (charts/)."""

"""What stands between a client's bytes and the handlers: connection deadlines and caps
(connections.py), TLS (tls.py), request bodies read and decoded within the limit (body.py), and
images in requests checked, fetched and decoded within their bounds (vision.py, image_fetch.py)."""

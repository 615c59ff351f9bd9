"""The broker's admin HTTP endpoint: the ASGI app (`app.py`), its dead-letter operations
(`dlq.py`) and the hypercorn server (`serve.py`)."""

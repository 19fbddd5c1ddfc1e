"""Flow control the whole fleet shares: the order runs are served in (`order.py`: resumed
runs first) and a model endpoint closed by a 429 (`gate.py`, `closes.py`)."""

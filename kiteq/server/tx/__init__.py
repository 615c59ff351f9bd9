"""Two-phase commit on the broker: producers' decisions and the back-scan that asks for them."""

"""The lookup API: HTTP serving of predictions, routing between workers, /metrics, the client.
The worker starts it in a process of its own (`process.py`), fed a replica of its table."""

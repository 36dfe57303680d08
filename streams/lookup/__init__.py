"""The lookup API: HTTP serving of predictions, routing between workers, /metrics, the client.
Runs inside the worker (`streams.runtime.app` installs it); `oracular query` is its client."""

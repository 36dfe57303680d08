"""The wall around Faust and aiokafka: every patch to them and every read of their internals.
Written for one faust-streaming version; importing `streams.faust.patches` refuses another.

| module | holds |
|---|---|
| `patches.py` | the one door: what the product calls; importing it applies every patch |
| `registry.py` | every patch: upstream method, pinned source hash, upstream issue, reason, test |
| `upstream.py` | the versions written for, the check, the upstream methods kept (`ORIGINALS`) |
| `delivery.py` | the fetch loop's deliveries, gaps and commit offsets (issue #606, PR #707) |
| `fetch.py` | which partitions are fetched, read-committed, how long a fetch waits |
| `recovery.py` | input partitions resumed only after they are sought |
| `worker_loop.py` | the consumer on the worker's event loop instead of its own thread |
| `producer.py` | the aiokafka producer, key partitions remembered, the buffer's ebb |
| `batches.py` | batches off Faust's stream (`take_batches`), `RawSchema` |
| `internals.py` | reads and the few writes of Faust's and aiokafka's private state |
"""

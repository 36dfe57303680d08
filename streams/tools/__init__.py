"""The operator's tools: broker checks, backfill ranges, reset, replay, produce/tail, topics.
Each runs from one `oracular` command (streams/cli/); none runs inside the worker's batch."""

"""The worker's runtime: one batch from consumed input to acknowledged outputs and states.
The app wiring, the processor, the commit order, fencing, the state table, positions, the timer."""

"""The discrete-event simulator of whole psrl runs, and engine profiling for the cost model."""

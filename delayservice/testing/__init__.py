"""Support for the tests, the demo and the benchmarks: nothing the daemon imports."""

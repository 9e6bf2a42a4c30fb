"""Developer tooling shared by the demo, the tests and the benchmarks; not part of the wheel."""

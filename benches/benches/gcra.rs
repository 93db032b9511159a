//! GCRA throughput suite (filled in by the benchmarks work).

fn main() {}
